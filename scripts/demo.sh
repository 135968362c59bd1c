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
build=${BUILD_DIR:-build}
log="$build/demo-install.log"
mkdir -p "$build"
echo "demo.sh: 1/3 Debian packages encache needs (scripts/install-deps.sh:" \
  "cmake, gcc, jansson, hiredis, xxhash, redis, Python 3 with torch, ...):" \
  "installing the missing ones, if any"
sh scripts/install-deps.sh
echo "demo.sh: 2/3 building and installing encache (a few minutes on a fresh" \
  "machine; the build's output goes to $log)"
if ! sh scripts/install.sh >"$log" 2>&1; then
  tail -n 30 "$log" >&2
  echo "demo.sh: the build or the install failed; the last lines of $log" \
    "are above" >&2
  exit 1
fi
tail -n 1 "$log"
echo "demo.sh: 3/3 running encache demo"
exec "$build/encache" demo "$@"
