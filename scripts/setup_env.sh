#!/usr/bin/env bash
# Installs everything gs_horovod needs on a fresh Debian machine, idempotently:
# OpenMPI + cmake (apt), a venv at $GS_VENV (default: <repo>/.venv) with torch 2.13.0 (CPU),
# tensorflow-cpu, numba, mpi4py, and Horovod 0.28.1 built from its PyPI sdist with the
# C++17 / no-XLA edits it needs against torch >= 2.1 and TF 2.21. A second run with all
# of this in place only checks a stamp and returns in about a second.
set -euo pipefail
export TF_CPP_MIN_LOG_LEVEL=2

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${GS_VENV:-$ROOT/.venv}"
HOROVOD_VERSION=0.28.1
PY_PACKAGES=(
  "torch==2.13.0" "tensorflow-cpu==2.21.0" "tf-keras~=2.21.0" "numba>=0.60" "mpi4py>=4"
  "scikit-learn" "tqdm" "pytest" "pytest-timeout" "ruff" "matplotlib" "psutil"
  "packaging" "cloudpickle" "pyyaml" "cffi" "mlxtend"
)
# The stamp changes whenever this script changes, so edits re-run the install.
STAMP_WANT="$(cat "${BASH_SOURCE[0]}" "$ROOT/setup.py" | sha256sum | cut -c1-16)"
STAMP_FILE="$VENV/.gs_horovod_stamp"

if [[ -f "$STAMP_FILE" && "$(cat "$STAMP_FILE")" == "$STAMP_WANT" ]] && command -v mpirun >/dev/null; then
  exit 0
fi

pip_quiet() { "$PY" -m pip "$@" 2> >(grep -v "^WARNING: Location" >&2); }
log() { printf '[setup_env] %s\n' "$*" >&2; }

need_apt=()
for pkg in libopenmpi-dev openmpi-bin cmake g++; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need_apt+=("$pkg")
done
if ((${#need_apt[@]})); then
  log "apt-get install ${need_apt[*]}"
  SUDO=""; [[ $(id -u) -eq 0 ]] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

if [[ ! -x "$VENV/bin/python" ]]; then
  log "creating venv $VENV"
  python3 -m venv "$VENV"
fi
PY="$VENV/bin/python"
pip_quiet install -q --upgrade pip setuptools wheel
log "pip install ${PY_PACKAGES[*]}"
pip_quiet install -q "${PY_PACKAGES[@]}"

# What the build below edits in Horovod's sources; a venv whose Horovod was built with other
# edits (or none) is rebuilt.
HOROVOD_EDITS="c++17 no-xla torch-enqueue-releases-gil"
HOROVOD_EDITS_FILE="$VENV/.gs_horovod_edits"
if ! "$PY" -c "import horovod, sys; sys.exit(horovod.__version__ != '$HOROVOD_VERSION')" 2>/dev/null \
   || ! "$PY" -c "import horovod.torch, horovod.tensorflow" 2>/dev/null \
   || [[ "$(cat "$HOROVOD_EDITS_FILE" 2>/dev/null)" != "$HOROVOD_EDITS" ]]; then
  log "building Horovod $HOROVOD_VERSION (about 4-6 minutes on 2 cores)"
  build="$(mktemp -d)"
  trap 'rm -rf "$build"' EXIT
  pip_quiet download -q --no-deps --no-binary :all: -d "$build" "horovod==$HOROVOD_VERSION"
  tar -xzf "$build/horovod-$HOROVOD_VERSION.tar.gz" -C "$build"
  src="$build/horovod-$HOROVOD_VERSION"
  sed -i 's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 17)/' "$src/CMakeLists.txt" "$src/horovod/torch/CMakeLists.txt"
  sed -i '/xla_mpi_ops\.cc/d' "$src/horovod/tensorflow/CMakeLists.txt"
  # torch's enqueue calls (allreduce, allgather, broadcast, alltoall, reducescatter, join,
  # barrier) drop the GIL while they run. Unedited, they hold it while waiting for the process-set
  # table's mutex, which the background thread holds while a failed peer's pending tensors are
  # freed, and freeing a tensor takes the GIL: an elastic job whose worker dies mid-step can
  # deadlock its survivors (docs/reliability.md).
  perl -0pi -e 's/(m\.def\(\s*"horovod_torch_\w*(?:async|join|barrier)\w*",\s*&Do\w+)\)/$1, py::call_guard<py::gil_scoped_release>())/g' \
    "$src/horovod/torch/mpi_ops_v2.cc"
  grep -q 'call_guard<py::gil_scoped_release>' "$src/horovod/torch/mpi_ops_v2.cc" \
    || { log "the GIL edit of horovod/torch/mpi_ops_v2.cc matched nothing"; exit 1; }
  (cd "$src" && HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 \
     HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1 MAKEFLAGS="-j$(nproc)" \
     pip_quiet install -q --no-build-isolation --no-deps .)
  echo "$HOROVOD_EDITS" > "$HOROVOD_EDITS_FILE"
fi

# the benchmark harness (gs_bench/, beside gs_horovod/) is not part of the package pip
# installs: the checkout's root goes on this venv's path for the examples and benchmarks
echo "$ROOT" > "$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/gs_bench_checkout.pth"

log "pip install -e $ROOT"
# pip's editable install is chatty (setuptools notices):
# keep its output, shown only if the install fails
if ! out="$("$PY" -m pip install -q --no-build-isolation --no-deps -e "$ROOT" 2>&1)"; then
  echo "$out" >&2; exit 1
fi

# the build check imports TensorFlow in subprocesses, whose C++ start-up log lines ignore
# TF_CPP_MIN_LOG_LEVEL: keep them with the check's output, shown only if the check fails
check="$("$VENV/bin/horovodrun" --check-build 2>&1)"
for part in PyTorch TensorFlow MPI Gloo; do
  grep -q "\[X\] $part" <<<"$check" || { echo "$check"; log "Horovod was built without $part"; exit 1; }
done
echo "$STAMP_WANT" > "$STAMP_FILE"
log "environment ready: $VENV"
