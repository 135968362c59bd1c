# SPDX-License-Identifier: Apache-2.0
# redis_up.sh: sourced by the test scripts that need real Redis servers
# (on_redis.sh, on_tier.sh), with $here set to the source tree.  Exits 77
# (skipped) without redis-server; else starts a Redis server and a Redis
# Cluster on free loopback ports (scripts/redis-servers.sh) in a fresh
# $dir, exports their URLs (DIR/env), and at exit runs the caller's
# `cleanup` function when it has one, then stops them and removes $dir.
if ! command -v redis-server >/dev/null || ! command -v redis-cli >/dev/null; then
  echo "skipped: redis-server is not installed"
  exit 77
fi
dir=$(mktemp -d)
trap 'if declare -F cleanup >/dev/null; then cleanup; fi
  bash "$here/scripts/redis-servers.sh" stop "$dir"; rm -rf "$dir"' EXIT
bash "$here/scripts/redis-servers.sh" start "$dir" >/dev/null || exit 1
# shellcheck disable=SC1091
. "$dir/env"
