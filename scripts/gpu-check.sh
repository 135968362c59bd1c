#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# gpu-check.sh: the device check of issue 13, on a machine with an NVIDIA
# GPU (and the build dependencies of scripts/install-deps.sh): prints what
# it finds (nvidia-smi, the CUDA runtime), builds encache in a fresh build
# folder ($BUILD_DIR, default build-gpu), runs the device tests on the real
# CUDA runtime ($ENCACHE_CUDA_LIBRARY if set, else libcudart.so; the tests
# that need the fake runtime's failure injection say "skipped"), then on
# the fake runtime, then bench_device on the real one, then (when $PYTHON,
# default python3, has torch with CUDA) the Python package's
# tests/python/gpu_check.py.  About 2 to 4
# minutes; each step is bounded.  Exit status: that of the first step
# that failed.
set -eu
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build-gpu}
jobs=$(nproc 2>/dev/null || echo 4)

echo "== machine: $(uname -srm), $jobs CPUs, $(date -u +%FT%TZ)"
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=index,name,driver_version,memory.total,pcie.link.gen.current,pcie.link.width.current --format=csv || nvidia-smi
else
  echo "nvidia-smi: not found"
fi
echo "CUDA runtime: ${ENCACHE_CUDA_LIBRARY:-libcudart.so from the loader's path}"
(ldconfig -p 2>/dev/null | grep -F libcudart) || echo "(ldconfig lists no libcudart)"

echo "== build ($build, fresh)"
rm -rf "$build"
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DENCACHE_PYTHON=OFF >/dev/null
timeout 240 cmake --build "$build" -j "$jobs" --target encache_tests \
  encache_fakecudart bench_device >/dev/null

echo "== device tests on the real CUDA runtime"
ENCACHE_TEST_CUDA_REAL=1 timeout 120 "$build/encache_tests" device_
echo "== device tests on the fake runtime (failure injection)"
timeout 120 "$build/encache_tests" device_
echo "== bench_device on the real CUDA runtime"
timeout 150 "$build/bench_device" --iterations 20
py=${PYTHON:-python3}
echo "== the Python package on CUDA torch ($py)"
if "$py" -c "import torch, sys; sys.exit(not torch.cuda.is_available())" 2>/dev/null; then
  cmake -S . -B "$build" -DENCACHE_PYTHON=ON \
    -DPython3_EXECUTABLE="$(command -v "$py")" >/dev/null
  timeout 240 cmake --build "$build" -j "$jobs" --target encache_python >/dev/null
  PYTHONPATH="$build/python" timeout 120 "$py" tests/python/gpu_check.py
else
  echo "skipped: $py has no torch with CUDA"
fi
echo "== gpu-check: done"
