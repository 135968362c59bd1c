#!/bin/sh
# test.sh: the test command of the README and of CI.  Installs missing
# dependencies, builds encache with warnings as errors in build/, and runs
# every test.  Extra arguments go to cmake (e.g. -DENCACHE_SANITIZE=address
# with BUILD_DIR=build-asan).
set -eu
cd "$(dirname "$0")/.."
sh scripts/install-deps.sh
build=${BUILD_DIR:-build}
cmake -S . -B "$build" -DENCACHE_WERROR=ON "$@" >/dev/null
cmake --build "$build" -j "$(nproc)"
ctest --test-dir "$build" --output-on-failure
