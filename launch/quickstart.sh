#!/usr/bin/env bash
# The main job: install, then FedAvg over 100 Fashion-MNIST clients on 2 MPI ranks.
# Writes runs/quickstart.h5 and runs/quickstart.png (replacing those of an earlier quickstart).
set -euo pipefail
cd "$(dirname "$0")/.."
bash launch/install.sh
exec launch/fedmpi-launch -n 2 configs/quickstart.yaml --plot runs/quickstart.png --overwrite "$@"
