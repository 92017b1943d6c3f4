"""What the torch and TensorFlow demos share: the data split, the per-epoch report and the
final summary, so both print and save the same things."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any, Callable

import numpy as np
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from tqdm import tqdm


def demo_arguments(description: str, compressions: list[str]) -> argparse.ArgumentParser:
    """The flags both demos take (data, model, optimizer, GsSketch options, output)."""
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--compression", choices=compressions, default="gs",
                   help="gs: GsSketch; none / fp16: Horovod's; others: baselines (torch only)")
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9, help="of the SGD optimizer")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ratio", type=float, default=0.02, help="gs: k / d per tensor")
    p.add_argument("--rows", type=int, default=5, help="gs: sketch rows")
    p.add_argument("--width", type=float, default=4.0, help="gs: sketch columns / k")
    p.add_argument("--no-exact", dest="exact", action="store_false", help="gs: skip the second round")
    p.add_argument("--warmup-steps", type=int, default=0, help="gs: dense steps first")
    p.add_argument("--json", help="write the per-epoch history to this file (rank 0)")
    return p


def digits_shard(rank: int, size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(x_train, y_train, x_test, y_test): 1,437 training images split over ranks (this rank's
    share), the same 360 held out on every rank; x float32 in [0, 1] (n, 64), y int64."""
    x, y = load_digits(return_X_y=True)
    x_train, x_test, y_train, y_test = train_test_split(
        x.astype(np.float32) / 16.0, y, test_size=0.2, random_state=0, stratify=y)
    return x_train[rank::size], y_train[rank::size], x_test, y_test


class Report:
    """A tqdm bar over epochs on rank 0, one printed line per epoch, and the JSON history."""

    def __init__(self, args: Any, rank: int, size: int, dense_bytes: int,
                 bytes_per_step: Callable[[], float], steps_per_epoch: int) -> None:
        self.args, self.rank, self.size = args, rank, size
        self.dense_bytes, self.bytes_per_step, self.steps = dense_bytes, bytes_per_step, steps_per_epoch
        self.history: list[dict] = []
        self.start = time.perf_counter()
        self.bar = tqdm(range(1, args.epochs + 1), desc="epochs", unit="epoch", disable=rank != 0,
                        file=sys.stderr, mininterval=0)

    def __iter__(self):
        return iter(self.bar)

    def epoch(self, epoch: int, loss: float, accuracy: float) -> None:
        sent = self.bytes_per_step()
        self.history.append({"epoch": epoch, "loss": loss, "accuracy": accuracy, "bytes_per_step": sent,
                             "steps": self.steps})
        self.bar.set_postfix(loss=f"{loss:.3f}", acc=f"{accuracy:.3f}")
        if self.rank == 0:
            self.bar.write(f"epoch {epoch:3d}  loss {loss:.4f}  test accuracy {accuracy:.4f}  "
                           f"bytes/step/rank {sent:,.0f} (dense {self.dense_bytes:,})", file=sys.stdout)

    def finish(self) -> dict:
        result = {"args": vars(self.args), "ranks": self.size, "dense_bytes_per_step": self.dense_bytes,
                  "seconds": time.perf_counter() - self.start, "history": self.history}
        if self.rank == 0:
            print(f"final test accuracy {self.history[-1]['accuracy']:.4f} after {self.args.epochs} epochs "
                  f"on {self.size} ranks in {result['seconds']:.1f} s", flush=True)
            if self.args.json:
                with open(self.args.json, "w") as f:
                    json.dump(result, f, indent=1)
        return result
