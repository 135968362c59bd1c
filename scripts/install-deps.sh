#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# install-deps.sh: installs, from Debian's packages, what encache needs to
# build and test.  Does nothing for packages already installed; needs root
# (or sudo) only when something is missing.  Nothing is downloaded from
# anywhere else.
set -eu

# redis-server (with redis-cli): the tests run the Stores' suites on real
# Redis servers and a Redis Cluster they start themselves.
# libstb-dev lets the demo load real PNG/JPEG images.
# man-db (man, with groff) reads the installed manual page (tests/install.sh).
# libxxhash-dev: XXH3-128 digests a model's weights (encache identity).
packages="cmake make gcc pkgconf libjansson-dev libhiredis-dev libxxhash-dev redis-server libstb-dev man-db"
# The Python package (python/) builds for Debian's python3 (python3-dev);
# its tests, demo and benchmark use torch, torchvision, NumPy and pytest,
# all from Debian (nothing from PyPI).
packages="$packages python3 python3-dev python3-numpy python3-torch python3-torchvision python3-pytest"
# tmux drives `encache top` and python3-prometheus-client's parser reads
# `encache stats --format prometheus` and the exporter (tests/fleet_tools.sh).
packages="$packages tmux python3-prometheus-client"
# valgrind checks for leaks in CI.
if [ "${CI:-}" = true ]; then
  packages="$packages valgrind"
fi
# clang and its runtimes build the fuzzers (libFuzzer) in CI.
if [ "${ENCACHE_FUZZ_DEPS:-0}" = 1 ]; then
  packages="$packages clang libclang-rt-14-dev"
fi

missing=""
for p in $packages; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed"; then
    missing="$missing $p"
  fi
done
[ -z "$missing" ] && exit 0

echo "install-deps: installing:$missing"
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null 2>&1 || {
    echo "install-deps: need root to install:$missing" >&2
    exit 1
  }
  sudo=sudo
fi
export DEBIAN_FRONTEND=noninteractive
# On a machine's first boot unattended-upgrades holds the package lock for
# minutes: wait for it (apt's own lock timeout) rather than die at once.
wait_s=${ENCACHE_APT_LOCK_WAIT:-900}
lock="-o DPkg::Lock::Timeout=$wait_s"
if command -v fuser >/dev/null 2>&1 &&
  $sudo fuser /var/lib/dpkg/lock-frontend /var/lib/dpkg/lock >/dev/null 2>&1; then
  echo "install-deps: another package manager holds the dpkg lock (first boot" \
    "runs unattended upgrades); waiting up to $wait_s s for it"
fi
fail() {
  echo "install-deps: could not $1 (apt-get's message is above). If another" \
    "package manager held the lock for more than $wait_s s, wait for it to" \
    "finish (or set ENCACHE_APT_LOCK_WAIT) and run this again." >&2
  exit 1
}
# shellcheck disable=SC2086
$sudo apt-get $lock update -qq || fail "update the package lists"
# shellcheck disable=SC2086
$sudo apt-get $lock install -y -qq --no-install-recommends $missing \
  >/dev/null || fail "install:$missing"
