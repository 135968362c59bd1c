#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# vllm-real.sh [PYTEST ARGS...]: the connector's contract against the
# real vLLM (tests/vllm_real, docs/vllm.md "Tests").  Makes or reuses the
# virtual environment of scripts/vllm-venv.sh (build/vllm-venv: vLLM from
# the Python package index, encache pip-installed from this checkout),
# prints the vLLM it tests, and runs the suite there; the end-to-end
# files (tests/vllm_real/*e2e*, scripts/vllm-e2e.sh) are left out.
# Exit status: the installer's when the environment cannot be made (its
# message above), else pytest's.  Needs no server: each test makes its own
# shm Store and destroys it.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${ENCACHE_VLLM_VENV:-build/vllm-venv}
start=$(date +%s)
bash scripts/vllm-venv.sh "$venv"
"$venv/bin/python" -c 'import vllm; print(f"vllm-real: vLLM {vllm.__version__}")'
set +e
PYTHONDONTWRITEBYTECODE=1 "$venv/bin/python" -m pytest -q -p no:cacheprovider -W ignore::DeprecationWarning \
  --ignore-glob='*e2e*' tests/vllm_real "$@"
rc=$?
set -e
echo "vllm-real: pytest exited $rc after $(( $(date +%s) - start )) s in all"
exit "$rc"
