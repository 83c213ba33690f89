#!/usr/bin/env bash
# The main job. First run sets up .venv and the offline data; flags go to the job.
#   ./run.sh                 # default: offline Fashion-MNIST
#   ./run.sh --quick         # a 30-second preset (MLP, 1 epoch, slices of the data)
#   ./run.sh --helpfull      # every flag (--help lists only the launcher's own: --quick)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/scripts/bootstrap.sh"
install_fashion_mnist || true
cd "$ROOT"
exec "$VENV/bin/python" -m experiments.reproduce "$@"
