#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# run.sh BUILD_DIR SOURCE_DIR [PYTEST ARGS...]: runs the Python package's
# suite (tests/python) with Debian's /usr/bin/python3 on the package built
# in BUILD_DIR/python, the tool BUILD_DIR/encache and the fault Store
# library (ENCACHE_PYFAULT_LIB, else BUILD_DIR/libencache_pyfault.so), with
# a Redis server and a Redis Cluster of its own (scripts/redis-servers.sh;
# without redis-server the Redis tests skip); ENCACHE_PY_SUITE names
# another suite directory (tests/vllm/run.sh).  Exits 77 (skipped) when
# /usr/bin/python3 cannot import torch or the extension was not built.
set -u
# A sanitizer build's runtimes (LD_PRELOAD) are for the interpreter only,
# not for this script's helpers and servers.
preload=${LD_PRELOAD-}
unset LD_PRELOAD
build=$(cd "${1:?usage: run.sh BUILD_DIR SOURCE_DIR}" && pwd)
src=$(cd "${2:?usage: run.sh BUILD_DIR SOURCE_DIR}" && pwd)
shift 2
py=/usr/bin/python3

if ! "$py" -c "import torch, numpy, pytest" 2>/dev/null; then
  echo "skipped: $py cannot import torch, numpy and pytest"
  exit 77
fi
# Not built is a skip; built but failing to import is a failure (pytest's).
if ! compgen -G "$build/python/encache/_encache*.so" >/dev/null; then
  echo "skipped: the extension encache._encache is not built in $build/python"
  exit 77
fi
export PYTHONPATH="$build/python${PYTHONPATH:+:$PYTHONPATH}"
export ENCACHE_TOOL="$build/encache"
export ENCACHE_PYFAULT_LIB="${ENCACHE_PYFAULT_LIB:-$build/libencache_pyfault.so}"
# test_mooncake.py runs on the stand-in Mooncake client the tests build
# (tests/fake_mooncake.c).
export ENCACHE_FAKE_MOONCAKE_LIB="$build/libfake_mooncake.so"
# test_cuda.py runs on the fake CUDA runtime the tests build
# (tests/fake_cudart.c); no other test touches a device.
if [ -f "$build/libencache_fakecudart.so" ]; then
  export ENCACHE_CUDA_LIBRARY="$build/libencache_fakecudart.so"
fi
# Nothing of the caller's may choose the Store or the Redis servers.
unset ENCACHE_STORE ENCACHE_REDIS_URL ENCACHE_REDIS_CLUSTER_URL \
  ENCACHE_REDIS_PASSWORD

dir=$(mktemp -d)
trap 'bash "$src/scripts/redis-servers.sh" stop "$dir" >/dev/null 2>&1; rm -rf "$dir"' EXIT
if command -v redis-server >/dev/null && command -v redis-cli >/dev/null; then
  bash "$src/scripts/redis-servers.sh" start "$dir" >/dev/null || exit 1
  set -a
  # shellcheck disable=SC1091
  . "$dir/env"
  set +a
else
  echo "# redis-server is not installed: the Redis tests will skip"
fi
cd "$src" || exit 1
export PYTHONDONTWRITEBYTECODE=1  # no __pycache__ in the source tree
env ${preload:+"LD_PRELOAD=$preload"} \
  "$py" -m pytest -q -p no:cacheprovider "$@" "${ENCACHE_PY_SUITE:-tests/python}"
