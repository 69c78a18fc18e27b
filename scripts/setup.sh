#!/usr/bin/env bash
# Installs what p2pnode needs on a fresh Debian/Ubuntu machine, only where it is missing:
# Debian's PyTorch, NumPy and scikit-learn for the system interpreter (PyPI is not needed),
# the pthread OpenBLAS (without it torch is 20-40x slower), and the Go modules.
#
#   scripts/setup.sh        everything the tests and tools use (make test, make learn)
#   scripts/setup.sh demo   only what training needs (make demo, make demo-local)
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${P2P_PYTHON:-/usr/bin/python3}
# python3-venv, -setuptools and -wheel: `pip install ./pyruntime/python` into a venv, offline.
# chromium: the dashboard's test renders the page in headless Chromium.
# python3-matplotlib: `make learn` plots its losses.
# conntrack: the WAN lab's router reboot fault (make wan-lab, make wan-faults) flushes it.
PKGS=(python3 python3-torch python3-numpy python3-sklearn libopenblas0-pthread)
IMPORTS="torch, numpy, sklearn"
if [ "${1:-}" != demo ]; then
  PKGS+=(python3-venv python3-setuptools python3-wheel chromium python3-matplotlib conntrack)
  IMPORTS="torch, numpy, sklearn, setuptools, wheel, venv"
fi

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]} (Debian packages)"
  SUDO=""
  if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null || { echo "setup: need root or sudo to install ${missing[*]}" >&2; exit 1; }
    SUDO="sudo"
  fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
"$PY" -c "import $IMPORTS" || { echo "setup: $PY cannot import $IMPORTS" >&2; exit 1; }

command -v go >/dev/null || export PATH=$PATH:/usr/local/go/bin
command -v go >/dev/null || { echo "setup: Go is not installed (need go >= 1.26; see https://go.dev/dl/)" >&2; exit 1; }
go mod download
echo "setup: ok ($(go version | cut -d' ' -f3), $("$PY" -c 'import torch; print("torch", torch.__version__)'))"
