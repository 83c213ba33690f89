#!/usr/bin/env bash
# The test suite. First run sets up .venv (and the Fashion-MNIST and Chromium packages,
# so the real-data and browser tests run); extra arguments go to pytest, e.g. ./test.sh -k binning
# The tests run on one pytest-xdist worker per core (at most 4; TEST_WORKERS=N to
# choose, 0 for one process), each test file on one worker (its fixtures made once).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/scripts/bootstrap.sh"
# The Debian packages install while the Python packages do (both mostly wait on the network).
{
  install_fashion_mnist || echo "[setup] real-data tests will be skipped" >&2
  install_chromium || echo "[setup] warning: the results page's browser test will be skipped" >&2
} &
install_python_packages
wait
cd "$ROOT"
cores="$(nproc 2>/dev/null || echo 1)"
workers="${TEST_WORKERS:-$((cores < 4 ? cores : 4))}"
[ "$workers" -le 1 ] && workers=0
# Files in tests/conftest.py's order (the slowest first), so the workers end together.
exec "$VENV/bin/python" -m pytest -n "$workers" --dist loadfile --no-loadscope-reorder "$@"
