#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# test.sh: the test command of the README and of CI.  Installs missing
# dependencies, builds encache with warnings as errors in build/, and runs
# every test (ctest).  Extra arguments go to cmake (e.g.
# -DENCACHE_SANITIZE=address with BUILD_DIR=build-asan).
set -eu
cd "$(dirname "$0")/.."
sh scripts/build.sh "$@"
ctest --test-dir "${BUILD_DIR:-build}" --output-on-failure
