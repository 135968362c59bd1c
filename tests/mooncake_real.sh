#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# mooncake_real.sh [BUILD_DIR]: encache on a real Mooncake Store, the one
# vLLM users install with pip (issue 43; docs/stores.md, "Mooncake from
# pip").  Makes the virtual environment build/mooncake-venv
# (scripts/mooncake-venv.sh: Mooncake's non-CUDA wheel, and encache
# installed from this checkout with pip), then, in a private network
# namespace (Mooncake's clients listen on every address), starts
# mooncake_master and a RAM-owning mooncake_client from the wheel on
# loopback (scripts/mooncake-servers.sh) and runs on them, through every
# route that loads:
#   - the C programs (tests/on_mooncake.sh: the Store conformance suite,
#     the engine's acceptance cases, the lookup threads, the tool's demo)
#     over Mooncake's Python client, through the package's C ABI over it
#     (BUILD_DIR/python/encache/_libs/libencache_mooncake_py.so);
#   - the same over Mooncake's own C ABI when MOONCAKE_C_LIBRARY names a
#     libmooncake_store.so (the wheels have none: said, not run);
#   - the Python suite tests/mooncake_real (the route a Python process
#     takes by itself), the console script `encache`, and the Python demo
#     (python -m encache.demo, real images, every hit verified);
#   - with vLLM's Python (build/vllm-venv, scripts/vllm-venv.sh: used when
#     it is there, never changed; said when not), the interop with vLLM's
#     own reuse code both ways (tests/mooncake_real/test_vllm_interop.py),
#     the vLLM contract suite (tests/vllm_real, ENCACHE_VLLM_REAL_STORE=
#     mooncake: its connectors on this Store) and the benchmark against vLLM's lookup path (bench/mooncake_vllm.py,
#     figures, not a pass/fail: MOONCAKE_BENCH_ROUNDS, default 20), with
#     Mooncake and encache for it installed with pip --target into
#     BUILD_DIR/vllm-mooncake-packages.
# Needs root (unshare -n), BUILD_DIR built (scripts/test.sh) and the
# Python package index.  ENCACHE_WHEEL=FILE: encache from that wheel
# (scripts/vllm-venv.sh).  A failed install fails the run.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-$here/build}" && pwd)
venv=$build/mooncake-venv
vpy=$build/vllm-venv/bin/python
vpkgs=$build/vllm-mooncake-packages
pins="mooncake-transfer-engine-non-cuda==0.3.13.post1"
if [ "${MOONCAKE_REAL_NETNS:-}" != 1 ]; then
  # Outside the namespace: the package index is reachable here only.
  bash "$here/scripts/mooncake-venv.sh" "$venv"
  if "$vpy" -c "import vllm" 2>/dev/null; then
    if [ "$(cat "$vpkgs/encache-pins" 2>/dev/null)" != "$pins" ]; then
      rm -rf "$vpkgs"
      "$vpy" -m pip install -q --no-deps --target "$vpkgs" $pins
      echo "$pins" >"$vpkgs/encache-pins"
    fi
    (cd "$here" && "$vpy" -m pip install -q --no-deps --upgrade \
      --target "$vpkgs" "${ENCACHE_WHEEL:-.}")
  fi
  exec unshare -n env MOONCAKE_REAL_NETNS=1 bash -c \
    'ip link set lo up && exec bash "$0" "$@"' "$0" "$build"
fi

dir=$(mktemp -d)
trap 'bash "$here/scripts/mooncake-servers.sh" stop "$dir"; rm -rf "$dir"' EXIT
export ENCACHE_MOONCAKE_PYTHON=$venv/bin/python
bash "$here/scripts/mooncake-servers.sh" start "$dir"
set -a
# shellcheck disable=SC1091
. "$dir/env"
set +a
unset ENCACHE_STORE ENCACHE_MOONCAKE_LIBRARY
export PYTHONDONTWRITEBYTECODE=1
# Mooncake's clients log to stderr (glog: lines "I1206 ...", "W...",
# "E..."): kept out of the output, which stays readable.
quiet() { grep -v -E '^[IWE][0-9]{4} |^WARNING: Logging before' || true; }
rc=0

echo "# route python, in the C programs: Mooncake's Python client through" \
  "the package's C ABI over it"
ENCACHE_TEST_MOONCAKE=1 \
  ENCACHE_MOONCAKE_LIBRARY=$build/python/encache/_libs/libencache_mooncake_py.so \
  bash "$here/tests/on_mooncake.sh" "$build/encache_tests" "$build/encache" \
  2>&1 | quiet || rc=1
[ "${PIPESTATUS[0]}" = 0 ] || rc=1

if [ -n "${MOONCAKE_C_LIBRARY:-}" ]; then
  echo "# route c-abi: $MOONCAKE_C_LIBRARY"
  ENCACHE_TEST_MOONCAKE=1 ENCACHE_MOONCAKE_LIBRARY=$MOONCAKE_C_LIBRARY \
    bash "$here/tests/on_mooncake.sh" "$build/encache_tests" \
    "$build/encache" 2>&1 | quiet
  [ "${PIPESTATUS[0]}" = 0 ] || rc=1
else
  echo "# route c-abi: not run: no libmooncake_store.so (Mooncake's wheels" \
    "have none; set MOONCAKE_C_LIBRARY to one built from its sources)"
fi

echo "# route python, in a Python process: tests/mooncake_real"
(cd "$here" && "$venv/bin/python" -m pytest -q -p no:cacheprovider \
  tests/mooncake_real 2>&1 | quiet
  exit "${PIPESTATUS[0]}") || rc=1

echo "# interop with vLLM's own reuse code (its mooncake_store_embedding)"
if [ -d "$vpkgs/encache" ] && "$vpy" -c "import vllm" 2>/dev/null; then
  (cd "$here" && PYTHONPATH=$vpkgs VLLM_HOST_IP=127.0.0.1 \
    MOONCAKE_REQUESTER_LOCAL_HOSTNAME=127.0.0.1 "$vpy" -m pytest -q \
    -p no:cacheprovider -W ignore::DeprecationWarning \
    tests/mooncake_real/test_vllm_interop.py 2>&1 | quiet
  exit "${PIPESTATUS[0]}") || rc=1
  echo "# the vLLM contract suite (tests/vllm_real) on this Mooncake Store"
  (cd "$here" && PYTHONPATH=$vpkgs VLLM_HOST_IP=127.0.0.1 \
    MOONCAKE_REQUESTER_LOCAL_HOSTNAME=127.0.0.1 ENCACHE_VLLM_REAL_STORE=mooncake \
    "$vpy" -m pytest -q -p no:cacheprovider -W ignore::DeprecationWarning \
    --ignore-glob='*e2e*' tests/vllm_real 2>&1 | quiet
  exit "${PIPESTATUS[0]}") || rc=1
  echo "# encache against vLLM's lookup path (figures)"
  (cd "$here" && PYTHONPATH=$vpkgs VLLM_HOST_IP=127.0.0.1 \
    MOONCAKE_REQUESTER_LOCAL_HOSTNAME=127.0.0.1 "$vpy" bench/mooncake_vllm.py \
    --rounds "${MOONCAKE_BENCH_ROUNDS:-20}" 2>&1 | quiet |
    grep -v "^Triton") || true
else
  echo "# not run: no vLLM in $build/vllm-venv (bash scripts/vllm-venv.sh" \
    "makes it)"
fi

echo "# the Python demo on Mooncake"
out=$(cd / && "$venv/bin/python" -m encache.demo --store mooncake: \
  --encoders 2 --requests 8 --images 6 --model-layers 1 2>&1) && st=0 || st=$?
if [ "$st" = 0 ] && printf '%s\n' "$out" | grep -q "verification *passed"; then
  printf '%s\n' "$out" | quiet | grep -E "Mooncake Store route|verification|hits" || true
  echo "ok - python -m encache.demo on mooncake:"
else
  printf '%s\n' "$out" | quiet
  echo "not ok - python -m encache.demo on mooncake: (exit $st)"
  rc=1
fi
exit $rc
