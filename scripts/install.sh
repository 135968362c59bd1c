#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# install.sh [CMAKE ARGS...]: builds encache (scripts/build.sh) and installs
# it under $PREFIX (default /usr/local): the library, the header, the tool,
# the manual page, and the Python package where Debian's python3 finds it,
# so that `python3 -c "import encache"` works.  Needs root (or sudo) for a
# system prefix.
set -eu
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}
prefix=${PREFIX:-/usr/local}
sh scripts/build.sh -DCMAKE_INSTALL_PREFIX="$prefix" "$@"
sudo=""
if [ ! -w "$prefix" ] && [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null 2>&1 || {
    echo "install.sh: need root to install into $prefix" >&2
    exit 1
  }
  sudo=sudo
fi
$sudo cmake --install "$build" >/dev/null
# The new shared library, for programs and the Python package.
if command -v ldconfig >/dev/null 2>&1; then
  $sudo ldconfig 2>/dev/null || true
fi
echo "install.sh: installed encache into $prefix"
