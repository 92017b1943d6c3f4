"""Shared set-up: the CUDA simulator for the Numba CUDA kernels, quiet TensorFlow, the ``slow``
tier, and a helper that runs a worker script under a real ``horovodrun`` or ``torchrun``.

Two tiers: ``pytest -m "not slow"`` runs in this one process (the engine on simulated ranks,
gs_horovod/transports/simulated.py); ``slow`` marks every test that launches a process
(horovodrun, torchrun, mpirun, a script, another interpreter), which a test outside the tier
is refused (:func:`pytest_runtest_protocol`). ``pytest tests`` runs both.

The workers (tests/workers/*.py) take an output folder, then what to run: the multi-scenario
ones (torch_scenarios, torch_reliability, tf_scenarios, ddp_scenarios, fsdp_scenarios after its
meshes, exchanges after its transport) the names of scenarios or of groups of them
(tests/workers/scenario.py; none: all, an unknown name lists them). The pytest side launches a
group per job (a launch costs seconds); one scenario runs alone from the command line, e.g.

    PYTHONPATH=. horovodrun -np 2 -H localhost:2 --gloo python tests/workers/torch_reliability.py /tmp/out nonfinite

and each rank leaves ``/tmp/out/rank<r>.json``. Assertions on those results use
tests/differ.py, which says which rank differed and both values."""

from __future__ import annotations

import json
import multiprocessing.process
import os
import shutil
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")  # no GPU here: CUDA kernels run simulated
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest  # noqa: E402
from workers.rank_result import result_path  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
WORKERS = Path(__file__).resolve().parent / "workers"

LAUNCHERS = ("horovodrun", "torchrun", "mpirun", "mpiexec", "bash", "sh")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: launches processes (ranks, scripts); deselect with -m 'not slow'")


_outside_slow: list[str] = []  # the node id of the test being run when it is not marked slow


def _refuse_outside_slow(what: str) -> None:
    if _outside_slow:
        pytest.fail(f"{_outside_slow[0]} launches {what} but is not marked slow: add @pytest.mark.slow",
                    pytrace=False)


def _launches(args) -> bool:
    """Whether a Popen's ``args`` start a Python interpreter, a launcher or a shell."""
    if isinstance(args, (str, bytes)):  # a command line (shell=True)
        args = os.fsdecode(args).split()
    elif isinstance(args, os.PathLike):
        args = [args]
    program = os.fsdecode(next(iter(args), ""))
    name = os.path.basename(program)
    return program == sys.executable or name.startswith("python") or name in LAUNCHERS


_popen_init = subprocess.Popen.__init__
_process_start = multiprocessing.process.BaseProcess.start


def _guarded_popen_init(self, args, *rest, **kw):
    if _launches(args):
        _refuse_outside_slow(repr(args)[:200])
    return _popen_init(self, args, *rest, **kw)


def _guarded_process_start(self):
    _refuse_outside_slow(f"a process ({self!r})")
    return _process_start(self)


subprocess.Popen.__init__ = _guarded_popen_init
multiprocessing.process.BaseProcess.start = _guarded_process_start


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem):
    """Around each test (its fixtures included): a test outside the slow tier that launches a
    Python interpreter, a launcher or a shell, or starts a multiprocessing process, fails naming
    what it launched."""
    if item.get_closest_marker("slow") is None:
        _outside_slow.append(item.nodeid)
    try:
        yield
    finally:
        _outside_slow.clear()


def launcher(name: str) -> str:
    """The path of this venv's ``name`` (horovodrun, torchrun), else the one on PATH."""
    found = shutil.which(name, path=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    assert found, f"{name} is not installed (run scripts/setup_env.sh)"
    return found


def horovodrun_command(np_: int, controller: str) -> list[str]:
    """``horovodrun`` (this venv's) on ``np_`` ranks of localhost with ``--gloo`` or ``--mpi``
    (oversubscribed, unbound); the program and its arguments go after it."""
    cmd = [launcher("horovodrun"), "-np", str(np_), "-H", f"localhost:{np_}", f"--{controller}"]
    if controller == "mpi":
        cmd += ["--mpi-args=--oversubscribe --bind-to none"]
    return cmd


def mpirun_command(np_: int) -> list[str]:
    """OpenMPI's ``mpirun`` on ``np_`` local ranks (oversubscribed, unbound, root allowed)."""
    mpirun = shutil.which("mpirun")
    assert mpirun, "OpenMPI's mpirun is not installed (run scripts/setup_env.sh)"
    return [mpirun, "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", str(np_)]


def rank_env() -> dict[str, str]:
    """The environment for processes on ranks: unbuffered output, one OpenMP thread, and the
    real Numba CUDA target (not the simulator this process uses)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    return env


def horovodrun(script: str, np_: int, controller: str, out_dir: Path, *args: str, timeout: float = 240) -> list[dict]:
    """Runs ``tests/workers/<script>`` on ``np_`` ranks of localhost with ``--gloo`` or
    ``--mpi`` and returns each rank's JSON result (``<out_dir>/rank<r>.json``)."""
    cmd = [*horovodrun_command(np_, controller), sys.executable, str(WORKERS / script), str(out_dir), *args]
    return run_workers(cmd, np_, out_dir, timeout)


def torchrun_command(np_: int) -> list[str]:
    """``torchrun`` (this venv's) on ``np_`` local ranks (``--standalone``: a free port); the
    program (``python``, ``--no-python``) and its arguments go after it."""
    return [launcher("torchrun"), "--standalone", "--nproc_per_node", str(np_), "--no-python"]


def torchrun(script: str, np_: int, out_dir: Path, *args: str, timeout: float = 240) -> list[dict]:
    """Runs ``tests/workers/<script>`` under ``torchrun`` on ``np_`` local ranks and returns
    each rank's JSON result."""
    cmd = [*torchrun_command(np_), sys.executable, str(WORKERS / script), str(out_dir), *args]
    return run_workers(cmd, np_, out_dir, timeout)


def run_workers(cmd: list[str], np_: int, out_dir: Path, timeout: float) -> list[dict]:
    """Runs a launcher command line; asserts it succeeded and reads ``np_`` ranks' results."""
    env = rank_env()
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    output = f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    assert proc.returncode == 0, f"{' '.join(cmd)} failed ({proc.returncode}):\n{output}"
    return [json.loads(result_path(out_dir, r).read_text()) for r in range(np_)]


@pytest.fixture
def run_ranks(tmp_path: Path):
    return lambda script, np_, controller, *args, **kw: horovodrun(script, np_, controller, tmp_path, *args, **kw)
