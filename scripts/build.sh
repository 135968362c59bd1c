#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# build.sh [CMAKE ARGS...]: installs missing dependencies (Debian packages)
# and builds encache in $BUILD_DIR (default build/) with warnings as errors.
set -eu
cd "$(dirname "$0")/.."
sh scripts/install-deps.sh
build=${BUILD_DIR:-build}
cmake -S . -B "$build" -DENCACHE_WERROR=ON "$@" >/dev/null
cmake --build "$build" -j "$(nproc)"
