#!/usr/bin/env bash
# Install the test dependencies, then run the whole test suite (MPI tests use real mpiexec).
set -euo pipefail
cd "$(dirname "$0")/.."
bash launch/install.sh --dev
exec ${PYTHON:-python3} -m pytest -q "$@"
