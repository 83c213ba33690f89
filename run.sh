#!/usr/bin/env bash
# The main job. First run sets up .venv and the offline data; flags go to the job.
#   ./run.sh                 # default: offline Fashion-MNIST
#   ./run.sh --help          # every flag
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/scripts/bootstrap.sh"
install_fashion_mnist || true
cd "$ROOT"
exec "$VENV/bin/python" -m experiments.reproduce "$@"
