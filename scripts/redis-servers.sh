#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# redis-servers.sh start DIR | stop DIR
#
# Starts, on free loopback ports, one Redis server and a Redis Cluster of
# three masters, for the tests; writes DIR/env with
#   ENCACHE_REDIS_URL=redis://127.0.0.1:PORT
#   ENCACHE_REDIS_UNIX_URL=unix://DIR/redis.sock (the same server)
#   ENCACHE_REDIS_CLUSTER_URL=redis-cluster://127.0.0.1:P1,127.0.0.1:P2,...
#   ENCACHE_REDIS_AUTH_URL=redis://127.0.0.1:PORT (a server started with
#     --requirepass; the URL has no password)
#   ENCACHE_REDIS_AUTH_PASSWORD='...' (its password, made for the run)
#   ENCACHE_REDIS_AUTH_FILE=DIR/redis-auth.pw (a file that holds it)
# "stop DIR" shuts them down.  Needs redis-server and redis-cli (Debian's
# redis-server package).
set -eu -o pipefail
cmd=${1:?usage: redis-servers.sh start|stop DIR}
dir=${2:?usage: redis-servers.sh start|stop DIR}

. "$(dirname "$0")/ports.sh"

stop_all() {
  pids=""
  for f in "$dir"/redis-*.pid; do
    [ -f "$f" ] || continue
    pid=$(cat "$f")
    kill "$pid" 2>/dev/null && pids="$pids $pid"
  done
  # Wait (at most 5 s) until they are gone: a server removes its socket
  # and pid file as it exits, which must not race the caller's cleanup.
  for pid in $pids; do
    i=0
    while kill -0 "$pid" 2>/dev/null && [ "$i" -lt 100 ]; do
      sleep 0.05
      i=$((i + 1))
    done
  done
  true
}

# start_server PORT [extra redis-server args...]: 0 when it answers PING.
# A port can look free and still fail to bind (a client's ephemeral port,
# a cluster bus port in TIME_WAIT): then the caller tries another.
start_server() {
  p=$1
  shift
  redis-server --port "$p" --bind 127.0.0.1 --save '' --appendonly no \
    --daemonize yes --dir "$dir" --logfile "$dir/redis-$p.log" \
    --pidfile "$dir/redis-$p.pid" "$@" || return 1
  i=0
  # With --requirepass, PING needs the password (redis-cli reads it from
  # REDISCLI_AUTH, not from its command line).
  until env ${ping_auth:+"REDISCLI_AUTH=$ping_auth"} redis-cli -p "$p" ping 2>/dev/null |
    grep -q PONG; do
    i=$((i + 1))
    if [ "$i" -ge 100 ] || grep -q "aborting" "$dir/redis-$p.log" 2>/dev/null; then
      [ -f "$dir/redis-$p.pid" ] && kill "$(cat "$dir/redis-$p.pid")" 2>/dev/null
      rm -f "$dir/redis-$p.pid"
      return 1
    fi
    sleep 0.05
  done
  # The PONG may come from another test's server that took the port first
  # (ctest -j): the server must be the one whose pid file this run wrote.
  own=$(cat "$dir/redis-$p.pid" 2>/dev/null || true)
  got=$(env ${ping_auth:+"REDISCLI_AUTH=$ping_auth"} redis-cli -p "$p" info server 2>/dev/null |
    sed -n 's/^process_id:\([0-9]*\).*/\1/p')
  if [ -z "$own" ] || [ "$own" != "$got" ]; then
    [ -n "$own" ] && kill "$own" 2>/dev/null
    rm -f "$dir/redis-$p.pid"
    return 1
  fi
}

# start_any FIRST_PORT [args...]: starts a server on the first port from
# FIRST_PORT that works; prints it.
start_any() {
  q=$1
  shift
  for attempt in $(seq 1 30); do
    q=$(free_port "$q")
    if start_server "$q" "$@"; then
      echo "$q"
      return 0
    fi
    q=$((q + 1))
  done
  echo "redis-servers.sh: no port would do after 30 attempts" >&2
  return 1
}

case $cmd in
start)
  mkdir -p "$dir"
  trap 'stop_all' ERR
  base=$((12000 + $$ % 18000))
  # The single server also listens on a Unix socket (unix:// URLs).
  single=$(start_any "$base" --unixsocket "$dir/redis.sock" --unixsocketperm 700)
  seeds=""
  p=$((single + 1))
  ports=""
  for n in 1 2 3; do
    p=$(start_any "$p" --cluster-enabled yes \
      --cluster-config-file "$dir/nodes-$n.conf" --cluster-node-timeout 2000 \
      --cluster-require-full-coverage no)
    ports="$ports $p"
    seeds="$seeds${seeds:+,}127.0.0.1:$p"
    p=$((p + 1))
  done
  # shellcheck disable=SC2086
  # Bounded: a node that went away makes it wait for the join forever.
  if ! timeout 60 redis-cli --cluster create \
    $(for q in $ports; do printf '127.0.0.1:%s ' "$q"; done) \
    --cluster-replicas 0 --cluster-yes >"$dir/cluster-create.log" 2>&1; then
    echo "redis-servers.sh: the cluster on$ports was not made:" >&2
    sed 's/^/  /' "$dir/cluster-create.log" >&2
    stop_all
    exit 1
  fi
  for q in $ports; do
    i=0
    until redis-cli -p "$q" cluster info | grep -q 'cluster_state:ok'; do
      i=$((i + 1))
      [ "$i" -lt 200 ] || { echo "cluster on $q not ok" >&2; exit 1; }
      sleep 0.05
    done
  done
  # A server that requires a password: ':' '@' and '/' in it exercise
  # the URL parser; the file holds it for password_file=.
  pw="pw-$RANDOM$RANDOM:p@ss/$$"
  printf '%s\n' "$pw" >"$dir/redis-auth.pw"
  chmod 600 "$dir/redis-auth.pw"
  auth=$(ping_auth=$pw start_any "$p" --requirepass "$pw")
  {
    echo "ENCACHE_REDIS_URL=redis://127.0.0.1:$single"
    echo "ENCACHE_REDIS_AUTH_URL=redis://127.0.0.1:$auth"
    echo "ENCACHE_REDIS_AUTH_PASSWORD='$pw'"
    echo "ENCACHE_REDIS_AUTH_FILE=$dir/redis-auth.pw"
    echo "ENCACHE_REDIS_UNIX_URL=unix://$dir/redis.sock"
    echo "ENCACHE_REDIS_CLUSTER_URL=redis-cluster://$seeds"
  } >"$dir/env"
  cat "$dir/env"
  ;;
stop)
  stop_all
  ;;
*)
  echo "usage: redis-servers.sh start|stop DIR" >&2
  exit 2
  ;;
esac
