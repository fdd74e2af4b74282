#!/usr/bin/env bash
# Install the test dependencies, then run the whole test suite (MPI tests use real mpiexec) on
# every core, up to 8 (pytest-xdist: one worker per core; FEDMPI_TEST_WORKERS=1 for one process).
set -euo pipefail
cd "$(dirname "$0")/.."
bash launch/install.sh --dev
workers=${FEDMPI_TEST_WORKERS:-$(nproc)}
(( workers > 8 )) && workers=8
if (( workers > 1 )); then
  exec ${PYTHON:-python3} -m pytest -q -n "$workers" "$@"
fi
exec ${PYTHON:-python3} -m pytest -q "$@"
