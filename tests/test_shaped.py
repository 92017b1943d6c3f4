"""scripts/bench/shaped.sh: ranks in their own network namespaces on links shaped by tc, real
mpirun ranks across them; skipped where namespaces cannot be made (not root, no ip/tc)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # every test here launches processes

SHAPED = Path(__file__).resolve().parents[1] / "scripts" / "bench" / "shaped.sh"
ENV = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}

RANK = r"""
import os, re, subprocess, numpy as np
from mpi4py import MPI
comm = MPI.COMM_WORLD
link = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True).stdout
name, address = re.search(r"\d+: (gs\d+br)\s+inet ([\d.]+)/24", link).groups()
qdisc = subprocess.run(["tc", "-s", "qdisc", "show", "dev", name], capture_output=True, text=True).stdout
sent_before = int(re.search(r"Sent (\d+) bytes", qdisc).group(1))
data = np.arange(1 << 18, dtype=np.float32)  # 1 MiB
if comm.rank == 0:
    comm.Send(data, dest=1)
else:
    got = np.empty_like(data)
    comm.Recv(got, source=0)
    assert np.array_equal(got, data)
comm.Barrier()
qdisc = subprocess.run(["tc", "-s", "qdisc", "show", "dev", name], capture_output=True, text=True).stdout
sent = int(re.search(r"Sent (\d+) bytes", qdisc).group(1)) - sent_before
rate = re.search(r"tbf \S+ root .*rate (\S+)", qdisc).group(1)
# a file per rank: mpirun's forwarding of a rank's last lines at exit dropped rank 0's once
with open(os.path.join(os.environ["SHAPED_TEST_OUT"], f"rank{comm.rank}"), "w") as f:
    f.write(f"RANK {comm.rank} {address} {rate} {sent}")
"""


@pytest.fixture(scope="module")
def permitted() -> None:
    check = subprocess.run(["bash", str(SHAPED), "--check"], capture_output=True, text=True, env=ENV)
    if check.returncode:
        pytest.skip(check.stderr.strip() or "shaped.sh --check failed")


def test_mpirun_ranks_on_shaped_links(permitted: None, tmp_path: Path) -> None:
    """Two mpirun ranks: each in its own namespace at NET.(rank+1), its link a tbf at the asked
    rate, rank 0's 1 MiB crossing its link (counted by tc); the namespaces gone afterwards."""
    out = subprocess.run(["bash", str(SHAPED), "100mbit", "2", "--", "mpirun", "-np", "2", sys.executable, "-c", RANK],
                         capture_output=True, text=True, env={**ENV, "SHAPED_TEST_OUT": str(tmp_path)}, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    net = re.search(r"\[shaped\] 2 ranks at (10\.77\.(\d+))\.1 ", out.stderr)
    assert net, out.stderr[-3000:]
    rows = sorted((tmp_path / f"rank{r}").read_text().split()[1:] for r in range(2))
    assert [r[:3] for r in rows] == [["0", f"{net.group(1)}.1", "100Mbit"], ["1", f"{net.group(1)}.2", "100Mbit"]]
    assert int(rows[0][3]) >= 1 << 20  # rank 0's message went over its shaped link, not shared memory
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert f"gs{net.group(2)}n0" not in namespaces.split()


def test_exit_status_and_reshaping(permitted: None) -> None:
    """The command's exit status comes back; shaped_rate reshapes every link ("local": none)."""
    script = ('tc qdisc show dev "$SHAPED_LINK"; shaped_rate 1gbit; tc qdisc show dev "$SHAPED_LINK"; '
              'shaped_rate local; tc qdisc show dev "$SHAPED_LINK"; exit 7')
    out = subprocess.run(["bash", str(SHAPED), "local", "1", "--", "bash", "-c", script],
                         capture_output=True, text=True, env=ENV, timeout=120)
    assert out.returncode == 7, out.stderr[-3000:]
    rates = [re.search(r"rate (\S+)", line).group(1) if "tbf" in line else "none"
             for line in out.stdout.splitlines() if line.startswith("qdisc")]
    assert rates == ["none", "1Gbit", "none"]
