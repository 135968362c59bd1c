#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# demo.sh [DEMO OPTIONS...]: the README's first command.  Installs missing
# dependencies, builds encache, and runs `encache demo` (a fleet of encoder
# processes sharing the embedded shared-memory Store; no server needed).
# Options go to the demo (see `build/encache demo --help`).
set -eu
cd "$(dirname "$0")/.."
sh scripts/build.sh >/dev/null
exec "${BUILD_DIR:-build}/encache" demo "$@"
