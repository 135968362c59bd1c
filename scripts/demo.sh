#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# demo.sh [DEMO OPTIONS...]: the README's first command.  Installs missing
# dependencies, builds encache, installs it (scripts/install.sh: the tool,
# the library and the Python package, `python3 -c "import encache"`), and
# runs `encache demo` (a fleet of encoder processes sharing the embedded
# shared-memory Store; no server needed).
# Options go to the demo (see `build/encache demo --help`).
set -eu
cd "$(dirname "$0")/.."
sh scripts/install.sh >/dev/null
exec "${BUILD_DIR:-build}/encache" demo "$@"
