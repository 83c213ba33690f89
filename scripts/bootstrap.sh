#!/usr/bin/env bash
# Sourced by run.sh and test.sh: make sure .venv exists with the pinned packages,
# and (when we can) that the offline Fashion-MNIST Debian package is installed
# (and, for test.sh, Chromium).
# Re-running is cheap: pip runs only when a requirements file changed.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${TOP1_VENV:-$ROOT/.venv}"
PYTHON_BIN="${PYTHON:-python3}"
FMNIST_DIR=/usr/share/datasets/fashion-mnist

if ! command -v "$PYTHON_BIN" >/dev/null 2>&1; then
  echo "error: $PYTHON_BIN not found; install Python >= 3.10 (Debian: apt-get install python3 python3-venv)" >&2
  exit 1
fi

if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating virtualenv $VENV"
  "$PYTHON_BIN" -m venv "$VENV" || {
    echo "error: could not create a virtualenv; on Debian: apt-get install python3-venv" >&2
    exit 1
  }
fi

# Reinstall only when the requirements or pyproject.toml changed.
stamp="$VENV/.top1_jax-installed"
want="$(cat "$ROOT/requirements.txt" "$ROOT/requirements-dev.txt" "$ROOT/pyproject.toml" | sha256sum | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "[setup] installing Python packages into $VENV (first run: a few minutes)"
  "$VENV/bin/python" -m pip install --quiet --upgrade pip
  "$VENV/bin/python" -m pip install --quiet -r "$ROOT/requirements-dev.txt"
  "$VENV/bin/python" -m pip install --quiet --no-deps -e "$ROOT"
  echo "$want" >"$stamp"
fi

# Offline default data set. Installed when missing and we are root (or have sudo);
# otherwise say how, and let the caller decide whether it needs it.
install_fashion_mnist() {
  [ -f "$FMNIST_DIR/t10k-labels-idx1-ubyte.gz" ] && return 0
  local sudo=""
  if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null && sudo="sudo -n" || {
      echo "[setup] Fashion-MNIST not found in $FMNIST_DIR; install it with" \
        "'sudo apt-get install dataset-fashion-mnist' or pass --data_dir" >&2
      return 1
    }
  fi
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "[setup] no apt-get here: put the Fashion-MNIST IDX files in a folder and pass --data_dir" >&2
    return 1
  fi
  echo "[setup] installing Debian package dataset-fashion-mnist"
  { $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq dataset-fashion-mnist; } >/dev/null ||
    { echo "[setup] apt-get install dataset-fashion-mnist failed" >&2; return 1; }
}

# A headless browser for the test that renders a run's index.html
# (tests/test_results_page.py, skipped without one). Installed when missing and we
# are root (or have sudo); a failure is a warning, not an error.
install_chromium() {
  local name
  for name in chromium chromium-browser google-chrome google-chrome-stable; do
    command -v "$name" >/dev/null 2>&1 && return 0
  done
  local sudo=""
  if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null && sudo="sudo -n" || {
      echo "[setup] no chromium found; install it with 'sudo apt-get install chromium'" >&2
      return 1
    }
  fi
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "[setup] no apt-get here: install Chromium (or Chrome) to render the results page" >&2
    return 1
  fi
  echo "[setup] installing Debian package chromium"
  { $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq chromium; } >/dev/null ||
    { echo "[setup] apt-get install chromium failed" >&2; return 1; }
}

export PATH="$VENV/bin:$PATH"
