#!/usr/bin/env bash
# Sourced by run.sh and test.sh: makes .venv and defines the set-up steps they call:
# the pinned Python packages, and (when we can) the offline Fashion-MNIST Debian package
# and, for test.sh, Chromium. Re-running is cheap: each step skips what is installed.
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

# The pinned packages, reinstalled only when the requirements or pyproject.toml changed.
# With uv's installer where it works (the same versions; it fetches and unpacks in
# parallel: 19 s against pip's 57 s for requirements-dev.txt on a fresh 2-core machine),
# else (uv not installable, or its install failed, e.g. behind an index only pip is
# configured for) with pip.
UV_VERSION=0.13.9
install_python_packages() {
  local stamp="$VENV/.top1_jax-installed" want
  want="$(cat "$ROOT/requirements.txt" "$ROOT/requirements-dev.txt" "$ROOT/pyproject.toml" | sha256sum | cut -d' ' -f1)"
  [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && return 0
  echo "[setup] installing Python packages into $VENV (first run: a minute or two)"
  local pip=("$VENV/bin/python" -m pip install --quiet --disable-pip-version-check)
  local uv=("$VENV/bin/python" -m uv pip install --quiet --compile-bytecode --python "$VENV/bin/python")
  if ! { "${pip[@]}" "uv==$UV_VERSION" 2>/dev/null && _install_with "${uv[@]}"; }; then
    echo "[setup] installing with pip (uv's installer is not available here)"
    "${pip[@]}" --upgrade pip
    _install_with "${pip[@]}"
  fi
  echo "$want" >"$stamp"
}

_install_with() {
  "$@" -r "$ROOT/requirements-dev.txt" && "$@" --no-deps -e "$ROOT"
}

# Debian packages: installed when missing and we are root (or have password-less sudo);
# otherwise say how, and let the caller decide whether it needs them. The package lists
# are fetched once per script.
APT_UPDATED=""
apt_install() {
  local package="$1" missing="$2" sudo=""
  if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null && sudo="sudo -n" || {
      echo "[setup] $missing; install it with 'sudo apt-get install $package'" >&2
      return 1
    }
  fi
  command -v apt-get >/dev/null 2>&1 || {
    echo "[setup] $missing, and no apt-get here to install it" >&2
    return 1
  }
  echo "[setup] installing Debian package $package"
  { [ -n "$APT_UPDATED" ] || $sudo apt-get update -qq; } >/dev/null && APT_UPDATED=1 &&
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$package" >/dev/null ||
    { echo "[setup] apt-get install $package failed" >&2; return 1; }
}

# The offline default data set.
install_fashion_mnist() {
  [ -f "$FMNIST_DIR/t10k-labels-idx1-ubyte.gz" ] ||
    apt_install dataset-fashion-mnist "Fashion-MNIST not found in $FMNIST_DIR (or pass --data_dir)"
}

# A headless browser for the test that renders a run's index.html
# (tests/test_results_page.py, skipped without one).
install_chromium() {
  local name
  for name in chromium chromium-browser google-chrome google-chrome-stable; do
    command -v "$name" >/dev/null 2>&1 && return 0
  done
  apt_install chromium "no Chromium (or Chrome) to render the results page"
}

export PATH="$VENV/bin:$PATH"
