#!/usr/bin/env bash
# on_redis.sh ENCACHE_TESTS: runs the Store conformance suite and the
# engine's acceptance cases on a real Redis server and on a real
# three-master Redis Cluster, started on free loopback ports for the run
# and stopped after it.  Exits 77 (skipped) without redis-server.
set -u
tests=$1
here=$(cd "$(dirname "$0")/.." && pwd)
if ! command -v redis-server >/dev/null || ! command -v redis-cli >/dev/null; then
  echo "skipped: redis-server is not installed"
  exit 77
fi
dir=$(mktemp -d)
trap 'bash "$here/scripts/redis-servers.sh" stop "$dir"; rm -rf "$dir"' EXIT
bash "$here/scripts/redis-servers.sh" start "$dir" >/dev/null || exit 1
# shellcheck disable=SC1091
. "$dir/env"
rc=0
for url in "$ENCACHE_REDIS_URL" "$ENCACHE_REDIS_CLUSTER_URL"; do
  echo "# on $url"
  ENCACHE_TEST_STORE=$url "$tests" store_ engine_ || rc=1
done
exit $rc
