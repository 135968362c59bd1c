#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# on_tier.sh ENCACHE_TESTS ENCACHE_TOOL: runs the Store conformance suite
# and the engine's acceptance cases on the tiered Store (issue 17): a
# fresh shm segment in front of a real Redis server, and in front of a
# real three-master Redis Cluster, started on free loopback ports for the
# run; then the tool's stats on a tier (its counters) and the demo with
# two simulated hosts.  Exits 77 (skipped) without redis-server.
set -u
tests=$1
tool=$2
here=$(cd "$(dirname "$0")/.." && pwd)
seg="encache-tier-ctest-$$"
cleanup() {
  for s in "$seg" "$seg-h0" "$seg-h1"; do
    "$tool" shm destroy "$s" >/dev/null 2>&1
  done
}
# shellcheck source=tests/redis_up.sh
. "$here/tests/redis_up.sh"
rc=0
for remote in "$ENCACHE_REDIS_URL" "$ENCACHE_REDIS_CLUSTER_URL"; do
  url="tier:shm://$seg?size=64MiB+$remote"
  echo "# on $url"
  ENCACHE_TEST_STORE=$url "$tests" store_ engine_ lookup_async_ || rc=1
  "$tool" shm destroy "$seg" >/dev/null
done
# The tool shows the tier's counters (of a segment that exists: stats
# never creates one, tests/tool.sh).
head -c 100 /dev/urandom >"$dir/obj"
"$tool" --store "shm://$seg?size=8MiB" put lonly "$dir/obj" >/dev/null
out=$("$tool" --store "tier:shm://$seg?size=8MiB+$ENCACHE_REDIS_URL" stats)
if printf '%s' "$out" | grep -q "^kind *tier" &&
   printf '%s' "$out" | grep -q "^promo_dropped *0"; then
  echo "ok - stats on a tier"
else
  echo "not ok - stats on a tier"; printf '%s\n' "$out"; rc=1
fi
# The tool's get finds an object only in the local tier, with the remote
# up (it does not have it) and with a remote that cannot be reached.
for remote in "$ENCACHE_REDIS_URL" "redis://127.0.0.1:1?connect_timeout_ms=200"; do
  if "$tool" --store "tier:shm://$seg?size=8MiB+$remote" get lonly >"$dir/got" &&
     cmp -s "$dir/obj" "$dir/got"; then
    echo "ok - get of a local-only object, remote $remote"
  else
    echo "not ok - get of a local-only object, remote $remote"; rc=1
  fi
done
"$tool" shm destroy "$seg" >/dev/null
# The demo with two simulated hosts (two shm tiers in front of one Redis):
# every hit verified, hits reported per tier, some of them remote (an
# image one host published, read by the other), the hosts' segments gone.
out=$("$tool" --store "tier:shm://$seg?size=64MiB+$ENCACHE_REDIS_URL" demo \
  --hosts 2 --encoders 4 --requests 40 --images 16 --tokens 16 --hidden 128 \
  --verify all --no-baseline 2>&1)
if [ $? -eq 0 ] && printf '%s' "$out" | grep -q "verification *passed" &&
   printf '%s' "$out" | grep -Eq "store hits by tier +[1-9][0-9]* local, [1-9][0-9]* remote .*2 hosts" &&
   ! [ -e "/dev/shm/encache-$seg-h0" ] && ! [ -e "/dev/shm/encache-$seg-h1" ]; then
  echo "ok - demo --hosts 2 on a tier"
else
  echo "not ok - demo --hosts 2 on a tier"; printf '%s\n' "$out"; rc=1
fi
"$tool" --store "$ENCACHE_REDIS_URL" demo --hosts 2 >/dev/null 2>"$dir/err"
if [ $? -eq 2 ] && grep -q "needs --store tier:" "$dir/err"; then
  echo "ok - demo --hosts 2 without a tier is refused"
else
  echo "not ok - demo --hosts 2 without a tier"; cat "$dir/err"; rc=1
fi
exit $rc
