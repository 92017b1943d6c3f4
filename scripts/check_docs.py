"""Catches drift between the hand-written docs (README.md, docs/*.md) and the repository.

    python scripts/check_docs.py                 # every doc; exit 1 naming each problem
    python scripts/check_docs.py --files docs/reliability.md --root COPY

What it checks, in each doc:

- **Commands.** Every command quoted in a fenced shell block, an indented block or an inline code
  span whose script is in this repository (``scripts/...py|sh``, or a script's file name) is
  parsed as the script would parse it: a Python script's ``parse_args(argv)`` (each documented
  script has one: its argparse parser and the checks it makes of the arguments, without running
  anything), so an unknown flag, method or choice fails; the shell wrappers' arguments are
  checked as they pass them on (``run_demo.sh`` to ``train_torch.py``, ``bench_throughput.sh``'s
  variants and extra flags, ``collective_sweep.sh``'s, ``shaped.sh``'s rate and inner command).
  Brace alternatives (``--simulated-ranks {4,16}``) are expanded as the shell would, ``for``
  loops take their first value, ``VAR=value`` prefixes and redirections are dropped.
- **Records.** A command that writes a file that exists in docs/ (``--out``, ``--plot``,
  ``--json``, ``--markdown``, a script's own ``outputs(args)``) names that file on its command
  line or in a comment of the command saying it regenerates it (``# regenerates docs/X``).
- **Run bits.** A script the docs run directly (``sudo scripts/bench/shaped.sh ...``, not
  ``bash ...`` or ``python ...``) is executable in the working tree and in git's index.
- **Tests.** Every test the docs name (``tests/test_x.py::test_y``, a bare ``test_y`` in
  backticks, or a file under tests/) exists in tests/.
- **Error messages.** Every message quoted in docs/reliability.md as ``SomeError: message`` is
  one the code can raise: its type is raised in gs_horovod/ and the message matches a string
  literal there (an f-string's fields match anything; a trailing ``…`` makes it a prefix).
- **Hand-written figures.** In README.md and in the headline tables of docs/benchmarks.md (the
  table rows before its first ``## `` section), a number with a unit (×, %, kB, B, bytes, bits,
  s, steps/s, points, Mbit/s, ...) outside ``<!-- report:NAME -->`` markers, code and link
  targets is a figure that can drift from its data: named, unless it is on the allow-list
  (:data:`ALLOWED_FIGURES`: a goal's bound after ≤, ≥, "within", "at most" or "at least", and a
  paper's published figure after "paper:"; :data:`ALLOWED_UNITS`: a link's rate, a setting).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import importlib.util
import io
import itertools
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

ROOT = Path(__file__).resolve().parents[1]
SHELL_LANGS = ("", "bash", "sh", "shell", "console")
RUNNERS = ("python", "python3", "bash", "sh", "sudo", "horovodrun", "torchrun", "mpirun", "nice", "timeout", "env",
           "scripts/", "./scripts/")
OUTPUT_FLAGS = ("out", "plot", "markdown", "loss_plot", "json", "validation_out")
ELLIPSIS = ("…", "...")


@dataclass
class Command:
    """One simple command as a doc quotes it: where, the text, its words, its comment."""

    doc: str
    line: int
    text: str
    words: list[str]
    comment: str = ""
    inline: bool = False

    def where(self) -> str:
        return f"{self.doc}:{self.line}"


@dataclass
class Problems:
    items: list[str] = field(default_factory=list)

    def add(self, where: str, message: str) -> None:
        self.items.append(f"{where}: {message}")


# ---------------------------------------------------------------------------------------------
# finding commands

def expand_braces(text: str) -> list[str]:
    """Bash's brace expansion of ``a{b,c}d`` (every combination; a brace without a comma stays)."""
    m = re.search(r"\{([^{}\s]*,[^{}\s]*)\}", text)
    if not m:
        return [text]
    return [out for alt in m[1].split(",") for out in expand_braces(text[:m.start()] + alt + text[m.end():])]


def strip_comment(line: str) -> tuple[str, str]:
    """(code, comment) of one shell line: a ``#`` that starts a word, outside quotes."""
    quote = None
    for i, c in enumerate(line):
        if quote:
            quote = None if c == quote else quote
        elif c in "'\"":
            quote = c
        elif c == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i], line[i + 1:].strip()
    return line, ""


def unroll_for(code: str) -> str:
    """``for V in a b; do BODY; done`` → BODY with ``$V`` as the first value."""
    m = re.match(r"\s*for\s+(\w+)\s+in\s+(.+?);\s*do\s+(.*?)(?:;\s*)?done\s*$", code, re.S)
    if not m:
        return code
    first = shlex.split(m[2])[0]
    return re.sub(r"\$\{?" + m[1] + r"\b\}?", first, m[3])


def simple_commands(code: str) -> list[list[str]]:
    """The words of each simple command of a shell line (split at ; && || |), without
    redirections and ``NAME=value`` prefixes."""
    code = re.sub(r"(?<![\w=-])\d*(?:>>?|<)&?\s*[^\s;|&]+", " ", code)  # redirections
    lexer = shlex.shlex(code, posix=True, punctuation_chars=";&|")
    lexer.whitespace_split = True
    words = list(lexer)
    out, current = [], []
    for w in words + [";"]:
        if w and set(w) <= set(";&|"):
            if current:
                out.append(current)
            current = []
        else:
            current.append(w)
    return [list(itertools.dropwhile(lambda w: re.match(r"^[A-Za-z_]\w*=", w), c)) for c in out]


def logical_lines(lines: list[tuple[int, str]]) -> Iterator[tuple[int, str, str]]:
    """(first line number, code, comment) of shell lines joined at trailing backslashes; a
    ``for ... do`` joined up to its ``done``."""
    buf, start, comments = "", 0, []
    for number, raw in lines:
        code, comment = strip_comment(raw)
        if not buf:
            start = number
        if comment:
            comments.append(comment)
        if code.rstrip().endswith("\\"):
            buf += code.rstrip()[:-1] + " "
            continue
        buf += code
        if re.match(r"\s*for\s", buf) and not re.search(r"\bdone\s*$", buf):
            buf += "; " if not buf.rstrip().endswith(("do", ";")) else " "
            continue
        if buf.strip():
            yield start, buf, " ".join(comments)
        buf, comments = "", []
    if buf.strip():
        yield start, buf, " ".join(comments)


def blocks(text: str) -> Iterator[tuple[bool, list[tuple[int, str]]]]:
    """Shell code in a Markdown text: (inline, [(line number, line)]) of fenced blocks of a shell
    language (or none), indented blocks (4 spaces, after a blank line, outside fences), and
    inline code spans (as one-line blocks)."""
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        fence = re.match(r"^\s*```(\w*)\s*$", lines[i])
        if fence:
            j = i + 1
            while j < len(lines) and not re.match(r"^\s*```\s*$", lines[j]):
                j += 1
            if fence[1] in SHELL_LANGS:
                yield False, [(n + 1, lines[n]) for n in range(i + 1, j)]
            i = j + 1
            continue
        if lines[i].startswith("    ") and (i == 0 or not lines[i - 1].strip()) and lines[i].strip():
            j = i
            while j < len(lines) and (lines[j].startswith("    ") or not lines[j].strip()):
                j += 1
            yield False, [(n + 1, lines[n][4:]) for n in range(i, j) if lines[n].strip()]
            i = j
            continue
        for span in re.finditer(r"`([^`\n]+)`", lines[i]):
            yield True, [(i + 1, span[1])]
        i += 1


def commands(doc: str, text: str, scripts: dict[str, Path]) -> Iterator[Command]:
    """Every simple command in ``text`` that runs a script of the repository (``scripts`` maps
    paths and file names to files), brace alternatives expanded. An inline code span is a
    command when it starts with a runner (python, bash, sudo, a launcher, .venv/bin/...) or with
    a script followed by arguments; a script's path alone is a reference, not a command."""
    for inline, block in blocks(text):
        for number, code, comment in logical_lines(block):
            code = unroll_for(code)
            words = code.split()
            if inline and not (words[0].startswith(RUNNERS) and not script_of(words[0], scripts)
                               or ".venv/bin/" in words[0] or (script_of(words[0], scripts) and len(words) > 1)):
                continue
            for variant in expand_braces(code):
                try:
                    simple = simple_commands(variant)
                except ValueError as e:  # unbalanced quotes: prose in backticks, or a broken command
                    if not inline and any(script_of(w, scripts) for w in variant.split()):
                        yield Command(doc, number, variant.strip(), [], f"unparsable: {e}")
                    continue
                for words in simple:
                    if any(script_of(w, scripts) for w in words):
                        yield Command(doc, number, variant.strip(), words, comment, inline)


def script_of(word: str, scripts: dict[str, Path]) -> Optional[Path]:
    word = word.removeprefix("./")
    return scripts.get(word)


def repository_scripts(root: Path) -> dict[str, Path]:
    """scripts/**/*.py|sh by path from the root, and by file name where it is unique."""
    found = sorted(p for p in (root / "scripts").rglob("*") if p.suffix in (".py", ".sh") and p.is_file())
    by = {str(p.relative_to(root)): p for p in found}
    names: dict[str, list[Path]] = {}
    for p in found:
        names.setdefault(p.name, []).append(p)
    by.update({n: ps[0] for n, ps in names.items() if len(ps) == 1})
    return by


# ---------------------------------------------------------------------------------------------
# parsing a command as its script does

class Scripts:
    """Loads each Python script once and parses argument lists with its ``parse_args``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.modules: dict[Path, Any] = {}
        for extra in (root, root / "scripts" / "bench", root / "scripts" / "examples", root / "scripts"):
            if str(extra) not in sys.path:
                sys.path.insert(0, str(extra))

    def module(self, path: Path) -> Any:
        if path not in self.modules:
            name = "_docs_" + re.sub(r"\W", "_", str(path.relative_to(self.root)))
            spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module  # dataclasses look their module up
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                spec.loader.exec_module(module)
            self.modules[path] = module
        return self.modules[path]

    def parse(self, path: Path, argv: list[str]) -> tuple[Optional[argparse.Namespace], str]:
        """(namespace, "") if the script accepts ``argv``; (None, why) if not."""
        module = self.module(path)
        parse = getattr(module, "parse_args", None)
        if parse is None:
            return None, ("takes no arguments, but the doc passes some" if argv else "")
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                return parse(argv), ""
        except SystemExit as e:
            lines = [line for line in err.getvalue().strip().splitlines() if line]
            return None, (lines[-1] if lines else f"exit {e.code}")


def outputs_of(module: Any, args: argparse.Namespace) -> list[str]:
    """The files a parsed command writes: the script's ``outputs(args)`` where it has one, else the
    values of its output flags."""
    if hasattr(module, "outputs"):
        return [str(p) for p in module.outputs(args)]
    return [str(getattr(args, f)) for f in OUTPUT_FLAGS if getattr(args, f, None)]


class Checker:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.scripts = repository_scripts(root)
        self.loader = Scripts(root)
        self.problems = Problems()

    # --- one command
    def command(self, cmd: Command) -> None:
        words = cmd.words
        if not words:
            self.problems.add(cmd.where(), f"`{shorten(cmd.text)}` is not a shell command: {cmd.comment}")
            return
        at = next(i for i, w in enumerate(words) if script_of(w, self.scripts))
        self.run(cmd, words, at)

    def run(self, cmd: Command, words: list[str], at: int) -> None:
        """Checks the script at ``words[at]`` with the words after it."""
        path, argv = script_of(words[at], self.scripts), words[at + 1:]
        rel = str(path.relative_to(self.root))
        lead = [w for w in words[:at] if w not in ("sudo", "exec")]
        shorthand = cmd.inline and not words[0].startswith(("sudo", "./"))  # `train_torch.py --flag` in prose
        if not lead and not shorthand:  # run directly: needs its run bit
            self.run_bit(cmd, path, rel)
        if path.suffix == ".sh":
            self.shell(cmd, rel, argv)
        else:
            self.python(cmd, path, rel, argv)

    def python(self, cmd: Command, path: Path, rel: str, argv: list[str]) -> None:
        try:
            args, why = self.loader.parse(path, argv)
        except Exception as e:  # noqa: BLE001 - a script that cannot be loaded is a finding
            self.problems.add(cmd.where(), f"{rel} could not be loaded to parse `{cmd.text}`: {type(e).__name__}: {e}")
            return
        if why:
            self.problems.add(cmd.where(), f"`{shorten(cmd.text)}`: {rel} rejects its arguments: {why}")
        if args is not None:
            self.records(cmd, outputs_of(self.loader.module(path), args))

    def shell(self, cmd: Command, rel: str, argv: list[str]) -> None:
        if rel == "scripts/run_demo.sh":
            rest = argv
            if rest[:1] == ["--launcher"]:
                if rest[1:2] not in (["horovodrun"], ["torchrun"]):
                    self.problems.add(cmd.where(), f"`{shorten(cmd.text)}`: --launcher takes horovodrun or torchrun")
                rest = rest[2:]
            self.python(cmd, self.root / "scripts/bench/train_torch.py", "scripts/bench/train_torch.py", rest)
        elif rel in ("scripts/bench/bench_throughput.sh", "scripts/bench/collective_sweep.sh"):
            positional = 5 if rel.endswith("bench_throughput.sh") else 3
            if not argv:
                self.problems.add(cmd.where(), f"`{shorten(cmd.text)}`: {rel} needs an output file")
                return
            self.records(cmd, [argv[0]])
            if rel.endswith("bench_throughput.sh") and len(argv) > 2:
                from gs_bench.variants import parse_variant

                for word in argv[2].split():
                    try:
                        parse_variant(word)
                    except ValueError as e:
                        self.problems.add(cmd.where(), f"`{shorten(cmd.text)}`: {e}")
            py = rel.replace(".sh", ".py")
            fixed = ["--compression", "gs"] if py.endswith("bench_throughput.py") else ["--label", "local"]
            self.python(cmd, self.root / py, py, fixed + argv[positional:])
        elif rel == "scripts/bench/shaped.sh":
            if argv[:1] == ["--check"]:
                return
            if len(argv) < 2 or not re.fullmatch(r"local|\d+(\.\d+)?[kmgt]?(bit|bps)", argv[0]) \
                    or not argv[1].isdigit():
                self.problems.add(cmd.where(), f"`{shorten(cmd.text)}`: shaped.sh takes RATE RANKS -- COMMAND")
                return
            inner = argv[3:] if argv[2:3] == ["--"] else argv[2:]
            at = next((i for i, w in enumerate(inner) if script_of(w, self.scripts)), None)
            if at is not None:
                self.run(cmd, ["python", *inner[at:]], 1)

    def run_bit(self, cmd: Command, path: Path, rel: str) -> None:
        if not os.access(path, os.X_OK):
            self.problems.add(cmd.where(), f"{rel} is run directly but is not executable (chmod +x)")
            return
        staged = subprocess.run(["git", "ls-files", "-s", rel], cwd=self.root, capture_output=True, text=True)
        if staged.returncode == 0 and staged.stdout.startswith("100644"):
            self.problems.add(cmd.where(), f"{rel} is run directly but git records it without its run bit "
                                           f"(git update-index --chmod=+x {rel})")

    def records(self, cmd: Command, outputs: list[str]) -> None:
        """An output that is an existing file of docs/ must be named on the command line or in a
        comment of the command that says it regenerates it."""
        named = set(re.findall(r"[\w.{},-]+\.\w+", cmd.text)) | set()
        said = {n for w in re.findall(r"[\w./{},-]+", cmd.comment) for n in expand_braces(w)}
        for out in outputs:
            p = Path(out) if Path(out).is_absolute() else self.root / out
            try:
                rel = p.resolve().relative_to((self.root / "docs").resolve())
            except ValueError:
                continue
            if not p.exists():
                continue
            explicit = any(Path(n).name == p.name for n in named)
            declared = "regenerates" in cmd.comment and any(Path(n).name == p.name for n in said)
            if not (explicit or declared):
                self.problems.add(cmd.where(), f"`{shorten(cmd.text)}` writes over the record docs/{rel}, which "
                                               "neither its command line nor a '# regenerates docs/...' comment names")

    # --- tests and messages
    def tests(self, doc: str, text: str) -> None:
        tests = self.root / "tests"
        defined: dict[str, set[str]] = {}
        for f in tests.rglob("*.py"):
            defined[str(f.relative_to(self.root))] = set(re.findall(r"^\s*(?:async\s+)?def (test_\w+)\(",
                                                                    f.read_text(), re.M))
        everywhere = set().union(*defined.values()) if defined else set()
        for number, line in enumerate(text.splitlines(), 1):
            for span in re.findall(r"`([^`\n]+)`", line):
                for m in re.finditer(r"(?<![\w/])(tests/[\w/]+\.py)(?:::(\w+)(\[[^\]]*\])?)?", span):
                    if m[1] not in defined:
                        self.problems.add(f"{doc}:{number}", f"names {m[1]}, which is not in tests/")
                    elif m[2] and m[2] not in defined[m[1]]:
                        self.problems.add(f"{doc}:{number}", f"names the test {m[1]}::{m[2]}, which {m[1]} "
                                                             "does not define")
                if re.fullmatch(r"test_\w+", span.strip()) and span.strip() not in everywhere:
                    self.problems.add(f"{doc}:{number}", f"names the test {span.strip()}, which no file in "
                                                         "tests/ defines")

    def messages(self, doc: str, text: str) -> None:
        templates, raised = message_templates(self.root / "gs_horovod")
        for number, line in enumerate(text.splitlines(), 1):
            for span in re.findall(r"`([^`\n]+)`", line):
                m = re.fullmatch(r"(\w+(?:Error|Exception|Warning)): (.+)", span.strip())
                if not m:
                    continue
                kind, message = m[1], m[2]
                if kind not in raised:
                    self.problems.add(f"{doc}:{number}", f"quotes {kind}, which gs_horovod/ never raises")
                elif not any(matches(t, message) for t in templates):
                    self.problems.add(f"{doc}:{number}", f"quotes the message `{shorten(span)}`, which no string "
                                                         "in gs_horovod/ can produce")

    def doc(self, rel: str) -> None:
        text = (self.root / rel).read_text()
        for cmd in commands(rel, text, self.scripts):
            self.command(cmd)
        self.tests(rel, text)
        if rel in FIGURE_DOCS:
            for number, figure in hand_written_figures(text, FIGURE_DOCS[rel]):
                self.problems.add(f"{rel}:{number}", f"the figure '{figure}' is hand-written: generate it between "
                                                     "report markers (scripts/bench/report.py) or drop it")
        if Path(rel).name == "reliability.md":
            self.messages(rel, text)


def shorten(text: str, n: int = 110) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[:n - 1] + "…"


# ---------------------------------------------------------------------------------------------
# hand-written figures

FIGURE_DOCS = {"README.md": "all", "docs/benchmarks.md": "headline"}
"""The docs whose figures must come from report markers, and which part of each is checked."""
UNIT = (r"(?:×(?!\s*\d)|x\b|%|[kKMG]i?B\b|B\b|bytes?\b|bits?\b|[mµ]?s\b|seconds?\b|minutes?\b|"
        r"steps/s\b|points?\b|[kMG]bit/s\b)")
FIGURE = re.compile(r"(?<![\w.^/=])[-−+]?\d[\d,]*(?:\.\d+)?(?:\s?[–-]\s?\d[\d,]*(?:\.\d+)?)?\s?" + UNIT)
ALLOWED_FIGURES = (
    re.compile(r"(?:[≤≥<>]|\bwithin|\bat most|\bat least)\s*$"),  # a goal's bound: "≤ 0.4×", "within 5 %"
    re.compile(r"\bpaper:\s*$"),  # a paper's published figure: "(paper: 1.3–3.1×)"
)
ALLOWED_UNITS = re.compile(r"\d\s?[kMG]bit/s$")
"""Figures allowed whatever precedes them: a link's rate, a study's setting (scripts/bench/shaped.sh)."""
"""What may precede an allowed hand-written figure (matched against the text before it)."""


def blank(m: re.Match) -> str:
    """The match as spaces, its newlines kept (line numbers stay)."""
    return re.sub(r"[^\n]", " ", m[0])


def figure_text(text: str, part: str) -> str:
    """``text`` with what may hold figures legitimately blanked: report blocks, fenced code,
    inline code, link targets and HTML comments; ``part="headline"``: only the table rows
    before the first ``## `` section."""
    text = report_marker().sub(blank, text)
    text = re.sub(r"^\s*```.*?^\s*```[^\n]*$", blank, text, flags=re.S | re.M)
    text = re.sub(r"`[^`\n]*`", blank, text)
    text = re.sub(r"\]\([^)\n]*\)", blank, text)
    text = re.sub(r"<!--.*?-->", blank, text, flags=re.S)
    if part == "headline":
        lines, out, head = text.splitlines(), [], True
        for line in lines:
            head = head and not line.startswith("## ")
            out.append(line if head and line.lstrip().startswith("|") else "")
        text = "\n".join(out)
    return text


def report_marker() -> re.Pattern:
    return re.compile(r"<!-- report:(?P<name>[\w.-]+) -->.*?<!-- /report:(?P=name) -->", re.S)


def hand_written_figures(text: str, part: str = "all") -> list[tuple[int, str]]:
    """(line, figure) of every number with a unit in ``text`` outside report markers, code and
    link targets (:func:`figure_text`) and not on :data:`ALLOWED_FIGURES`."""
    out = []
    for number, line in enumerate(figure_text(text, part).splitlines(), 1):
        for m in FIGURE.finditer(line):
            if not (ALLOWED_UNITS.search(m[0]) or any(a.search(line[:m.start()]) for a in ALLOWED_FIGURES)):
                out.append((number, m[0].strip()))
    return out


# ---------------------------------------------------------------------------------------------
# messages the code can produce

Piece = Optional[str]  # a literal, or None for a field that matches anything


def pieces_of(node: ast.AST) -> Optional[list[Piece]]:
    """A string expression as literal pieces and fields: str constants, f-strings, ``+`` of them,
    and the lists of parts the engine's checks join; None if it holds no literal text."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.JoinedStr):
        return [v.value if isinstance(v, ast.Constant) else None for v in node.values]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = pieces_of(node.left), pieces_of(node.right)
        if left is None and right is None:
            return None
        return (left or [None]) + (right or [None])
    if isinstance(node, (ast.List, ast.Tuple)) and any(isinstance(e, (ast.Constant, ast.JoinedStr)) for e in node.elts):
        out: list[Piece] = []
        for e in node.elts:
            out += pieces_of(e) or [None]
        return out
    return None


def message_templates(package: Path) -> tuple[list[list[Piece]], set[str]]:
    """Every string template in ``package`` and the names of the exceptions it raises (or hands
    to a check that raises them)."""
    templates, raised = [], set()
    for f in package.rglob("*.py"):
        tree = ast.parse(f.read_text())
        for node in ast.walk(tree):
            p = pieces_of(node)
            if p and any(x for x in p if x):
                templates.append(p)
            if isinstance(node, ast.Raise) and node.exc is not None:
                target = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
                if isinstance(target, ast.Name):
                    raised.add(target.id)
            if isinstance(node, ast.Call):
                raised.update(a.id for a in node.args if isinstance(a, ast.Name) and a.id.endswith(("Error",
                                                                                                  "Exception")))
    return templates, raised


def matches(template: list[Piece], quoted: str) -> bool:
    """Whether ``quoted`` (a trailing ``…`` makes it a prefix) is what ``template`` can produce."""
    prefix = quoted.rstrip().endswith(ELLIPSIS)
    text = quoted.rstrip()
    for e in ELLIPSIS:
        text = text.removesuffix(e)
    text = text.rstrip()
    parts = [re.escape(p) if p is not None else ".+?" for p in template]
    if not prefix:
        return re.fullmatch("".join(parts), text, re.S) is not None
    # a prefix: the quote ends somewhere inside the template
    for i, piece in enumerate(template):
        head = "".join(parts[:i])
        if piece is None:
            if re.fullmatch(head + ".*", text, re.S):
                return True
            continue
        for cut in range(len(piece), 0, -1):
            if re.fullmatch(head + re.escape(piece[:cut]), text, re.S):
                return True
    return False


# ---------------------------------------------------------------------------------------------

def doc_files(root: Path) -> list[str]:
    return ["README.md"] + sorted(str(p.relative_to(root)) for p in (root / "docs").glob("*.md"))


def check(root: Path, files: Optional[list[str]] = None) -> list[str]:
    checker = Checker(root)
    for rel in files or doc_files(root):
        checker.doc(rel)
    return checker.problems.items


def main(argv: Optional[list[str]] = None, out: Callable[[str], None] = print) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--root", type=Path, default=ROOT, help="the repository (or a copy) whose docs to check")
    p.add_argument("--files", nargs="+", help="docs relative to the root (default: README.md and docs/*.md)")
    args = p.parse_args(argv)
    problems = check(args.root.resolve(), args.files)
    for problem in problems:
        out(problem)
    out(f"check_docs: {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
