#!/usr/bin/env bash
# The main job. First run sets up .venv and the offline data; flags go to the job.
#   ./run.sh                                   # top1_jax/configs/default.py into runs/default
#   ./run.sh --config=quick                    # a 30-second preset (MLP, 1 epoch, slices)
#   ./run.sh '--config.dropout_rates=(0.05,)'  # any field of the config, overridden
#   ./run.sh --helpfull                        # every flag
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/scripts/bootstrap.sh"
{ install_fashion_mnist || true; } &
install_python_packages
wait
cd "$ROOT"
# No --config here: the launcher's default is top1_jax/configs/default.py, and a second
# --config from "$@" with --config.<field> overrides would define each override twice.
exec "$VENV/bin/python" "$ROOT/experiments/reproduce.py" "$@"
