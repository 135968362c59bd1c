#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# mooncake-venv.sh [DIR]: a virtual environment (default
# build/mooncake-venv) with Mooncake from the Python package index, as a
# vLLM user without CUDA installs it (mooncake-transfer-engine-non-cuda,
# pinned below: docs/stores.md, "Mooncake from pip"), and encache installed
# from this checkout with pip.  Made with Debian's /usr/bin/python3 (or
# $ENCACHE_VENV_PYTHON) and its packages (--system-site-packages: torch,
# NumPy and pytest for the tests), reused while the pin is the same;
# encache is reinstalled every time.  A failed install fails this script
# with the installer's message.  ENCACHE_WHEEL=FILE: encache from that
# wheel (as in scripts/vllm-venv.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:-build/mooncake-venv}
mkdir -p "$(dirname "$venv")"
venv=$(cd "$(dirname "$venv")" && pwd)/$(basename "$venv")
py=${ENCACHE_VENV_PYTHON:-/usr/bin/python3}
pins="mooncake-transfer-engine-non-cuda==0.3.13.post1"
start=$(date +%s)
if [ ! -f "$venv/encache-pins" ] || [ "$(cat "$venv/encache-pins")" != "$pins" ]; then
  rm -rf "$venv"
  "$py" -m venv --system-site-packages "$venv"
  "$venv/bin/python" -m pip install -q $pins
  echo "$pins" >"$venv/encache-pins"
fi
"$venv/bin/python" -m pip install -q --no-deps --force-reinstall "${ENCACHE_WHEEL:-.}"
(cd / && "$venv/bin/python" - <<'PY')
import importlib.metadata as md, sys
import encache, mooncake.store
print(f"mooncake-venv: Python {sys.version.split()[0]}, "
      f"mooncake-transfer-engine-non-cuda "
      f"{md.version('mooncake-transfer-engine-non-cuda')}, "
      f"encache {encache.__version__} ({encache.__file__})")
PY
echo "mooncake-venv: ready in $(( $(date +%s) - start )) s: $venv"
