#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# mooncake-servers.sh start DIR | stop DIR
#
# Starts a Mooncake Store from Mooncake's wheel (docs/stores.md, "Mooncake
# from pip"): mooncake_master and a mooncake_client that owns the pool's
# RAM ($MOONCAKE_SEGMENT, default 1GB), on free loopback ports, with the
# binaries of the package `mooncake` of $ENCACHE_MOONCAKE_PYTHON (default
# python3).  Writes DIR/mooncake.json (the encoders' client JSON: pure
# clients, P2PHANDSHAKE, TCP) and DIR/env with
#   MOONCAKE_CONFIG_PATH=DIR/mooncake.json
#   MOONCAKE_MASTER=127.0.0.1:PORT
# and the logs DIR/master.log and DIR/client.log.  "stop DIR" stops them
# (SIGTERM, the client first).
#
# Mooncake's clients listen on every address whatever they are told, so
# this runs only in a private network namespace, one whose only link is
# the loopback (`unshare -n`, then `ip link set lo up`; the test scripts
# do it): elsewhere it refuses, unless MOONCAKE_ANY_NETWORK=1.
set -eu -o pipefail
cmd=${1:?usage: mooncake-servers.sh start|stop DIR}
dir=${2:?usage: mooncake-servers.sh start|stop DIR}

. "$(dirname "$0")/ports.sh"

# stop_pid FILE: SIGTERM to the process in FILE, waited for (at most 20 s,
# then SIGKILL).
stop_pid() {
  [ -f "$1" ] || return 0
  pid=$(cat "$1")
  rm -f "$1"
  kill "$pid" 2>/dev/null || return 0
  i=0
  while kill -0 "$pid" 2>/dev/null; do
    i=$((i + 1))
    if [ "$i" -ge 400 ]; then
      echo "mooncake-servers: $pid ignored SIGTERM for 20 s: killed" >&2
      kill -9 "$pid" 2>/dev/null || true
      break
    fi
    sleep 0.05
  done
}

if [ "$cmd" = stop ]; then
  stop_pid "$dir/client.pid"
  stop_pid "$dir/master.pid"
  exit 0
fi
[ "$cmd" = start ] || { echo "usage: mooncake-servers.sh start|stop DIR" >&2; exit 2; }

links=$(ip -o link show 2>/dev/null | wc -l)
if [ "$links" != 1 ] && [ "${MOONCAKE_ANY_NETWORK:-0}" != 1 ]; then
  echo "mooncake-servers: Mooncake's clients listen on every address: run" \
    "this in a private network namespace (unshare -n, ip link set lo up)," \
    "or set MOONCAKE_ANY_NETWORK=1" >&2
  exit 1
fi
py=${ENCACHE_MOONCAKE_PYTHON:-python3}
pkg=$("$py" -c 'import mooncake, os; print(os.path.dirname(mooncake.__file__))') || {
  echo "mooncake-servers: $py has no package mooncake (pip install" \
    "mooncake-transfer-engine-non-cuda)" >&2
  exit 1
}
mkdir -p "$dir"

# wait_port PORT PIDFILE WHAT: until something listens on PORT (60 s), or
# fails when the process is gone.
wait_port() {
  i=0
  while port_free "$1"; do
    if ! kill -0 "$(cat "$2")" 2>/dev/null; then
      echo "mooncake-servers: $3 exited; its log:" >&2
      tail -n 20 "$dir/$3.log" >&2
      return 1
    fi
    i=$((i + 1))
    if [ "$i" -ge 1200 ]; then
      echo "mooncake-servers: $3 not listening on $1 after 60 s" >&2
      return 1
    fi
    sleep 0.05
  done
}

rpc=$(free_port 50051)
metrics=$(free_port $((rpc + 1)))
"$pkg/mooncake_master" --rpc_port="$rpc" --rpc_address=127.0.0.1 \
  --metrics_host=127.0.0.1 --metrics_port="$metrics" --logtostderr \
  >"$dir/master.log" 2>&1 &
echo $! >"$dir/master.pid"
wait_port "$rpc" "$dir/master.pid" master || { stop_pid "$dir/master.pid"; exit 1; }
port=$(free_port $((metrics + 1)))
"$pkg/mooncake_client" --host=127.0.0.1 --port="$port" \
  --master_server_address="127.0.0.1:$rpc" --metadata_server=P2PHANDSHAKE \
  --protocol=tcp --global_segment_size="${MOONCAKE_SEGMENT:-1GB}" \
  --logtostderr >"$dir/client.log" 2>&1 &
echo $! >"$dir/client.pid"
# It listens on --port once its segment is mounted.
wait_port "$port" "$dir/client.pid" client || {
  stop_pid "$dir/client.pid"; stop_pid "$dir/master.pid"; exit 1; }
cat >"$dir/mooncake.json" <<EOF
{"local_hostname": "127.0.0.1", "metadata_server": "P2PHANDSHAKE",
 "master_server_address": "127.0.0.1:$rpc", "protocol": "tcp",
 "device_name": "", "mode": "standalone-store", "global_segment_size": 0,
 "local_buffer_size": "64MB"}
EOF
cat >"$dir/env" <<EOF
MOONCAKE_CONFIG_PATH=$dir/mooncake.json
MOONCAKE_MASTER=127.0.0.1:$rpc
EOF
echo "mooncake-servers: master 127.0.0.1:$rpc, client 127.0.0.1:$port" \
  "(${MOONCAKE_SEGMENT:-1GB}), $(cat "$dir/env" | head -n 1)"
