#!/usr/bin/env bash
# The main job: install, then FedAvg over 100 Fashion-MNIST clients on 2 MPI ranks.
# Writes runs/quickstart.h5 and runs/quickstart.png (replacing those of an earlier quickstart).
# The install is skipped when this checkout is installed for this Python and unchanged since
# (launch/installed.py: its packaging files and install.sh; Python files need no reinstall, the
# install is editable); `bash launch/install.sh` reinstalls.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
extras="mpi,data"  # what launch/install.sh installs without --dev
if $PY launch/installed.py check "$extras" 2>/dev/null; then
  echo "quickstart: fedmpi is installed from this checkout, unchanged: install skipped (bash launch/install.sh reinstalls)" >&2
else
  bash launch/install.sh
  $PY launch/installed.py record "$extras"
fi
exec launch/fedmpi-launch -n 2 configs/quickstart.yaml --plot runs/quickstart.png --overwrite "$@"
