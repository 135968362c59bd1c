#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# test.sh: the test command of the README and of CI.  Installs missing
# dependencies, builds encache with warnings as errors in build/, and runs
# every test (ctest).  Extra arguments go to cmake (e.g.
# -DENCACHE_SANITIZE=address with BUILD_DIR=build-asan).
set -eu
cd "$(dirname "$0")/.."
sh scripts/build.sh "$@"
# A test that hangs (a process left holding ctest's pipe included) fails
# after ENCACHE_CTEST_TIMEOUT seconds (default 1200; the slowest, the unit
# tests under AddressSanitizer, take a few minutes) with its output,
# instead of holding the run until CI gives up on it.
ctest --test-dir "${BUILD_DIR:-build}" --output-on-failure \
  --timeout "${ENCACHE_CTEST_TIMEOUT:-1200}"
