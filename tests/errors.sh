#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# errors.sh ENCACHE_TOOL: the tool says why a Store failed (issue 18), on
# real redis-server processes started here on free loopback ports: one
# that requires a password (given a wrong one), one that is full
# (maxmemory 1mb, noeviction, filled first), and a port where nothing
# listens.  lookup prints three different causes (and "why" in --json);
# publish prints the Store's OOM reason; lookup and stats exit 1 for the
# same failure; the demo stops at once with the reason.  Exits 77
# (skipped) without redis-server.
set -u
tool=$1
if ! command -v redis-server >/dev/null || ! command -v redis-cli >/dev/null; then
  echo "skipped: redis-server is not installed"
  exit 77
fi
dir=$(mktemp -d)
stop() {
  for f in "$dir"/*.pid; do
    [ -f "$f" ] && kill "$(cat "$f")" 2>/dev/null
  done
  sleep 0.2
  rm -rf "$dir"
}
trap stop EXIT
fails=0
n=0

. "$(dirname "$0")/../scripts/ports.sh"
# serve NAME PORT ARGS...: a redis-server on PORT, ready when it returns.
serve() {
  name=$1 port=$2
  shift 2
  redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no \
    --dir "$dir" --daemonize yes --pidfile "$dir/$name.pid" "$@" >/dev/null
  for _ in $(seq 100); do
    redis-cli -p "$port" ping 2>/dev/null | grep -q 'PONG\|NOAUTH' && return 0
    sleep 0.05
  done
  echo "not ok - redis-server $name did not start"; exit 1
}

auth_port=$(free_port 23000)
serve auth "$auth_port" --requirepass "pw-$$-$RANDOM"
full_port=$(free_port $((auth_port + 1)))
serve full "$full_port" --maxmemory 1mb --maxmemory-policy noeviction
refused_port=$(free_port $((full_port + 1)))
# Fill the full one until it refuses writes.
value=$(head -c 1000 /dev/zero | tr '\0' x)
for i in $(seq 3000); do echo "SET fill$i $value"; done |
  redis-cli -p "$full_port" 2>&1 | grep -q OOM ||
  { echo "not ok - could not fill the server"; exit 1; }

wrong="redis://:wrong@127.0.0.1:$auth_port"
full="redis://127.0.0.1:$full_port"
refused="redis://127.0.0.1:$refused_port"
args="--model m --dtype float32 --rows 1 --cols 1"
printf '\000\000\200\077' > "$dir/payload"

# expect NAME WANT_STATUS NEEDLE -- ARGS...: the tool's exit status and
# NEEDLE in its output (stdout and stderr); the output is left in $out.
expect() {
  name=$1 want=$2 needle=$3
  shift 4
  n=$((n + 1))
  out=$("$tool" "$@" 2>&1)
  got=$?
  if [ "$got" -ne "$want" ]; then
    echo "not ok $n - $name: exit $got, expected $want"; echo "$out" | sed 's/^/# /'
    fails=$((fails + 1))
  elif ! printf '%s\n' "$out" | grep -qF -- "$needle"; then
    echo "not ok $n - $name: output lacks '$needle'"; echo "$out" | sed 's/^/# /'
    fails=$((fails + 1))
  else
    echo "ok $n - $name"
  fi
}

# --- lookup: three failures, three causes
# shellcheck disable=SC2086
expect "lookup, wrong password" 1 "img UNAVAILABLE" -- --store "$wrong" lookup $args img
cause_auth=${out#img UNAVAILABLE }
# shellcheck disable=SC2086
expect "lookup, connection refused" 1 "img UNAVAILABLE" -- --store "$refused" lookup $args img
cause_refused=${out#img UNAVAILABLE }
# A full server still serves reads: the object is simply not there (it
# could not be written: publish says so, below).
# shellcheck disable=SC2086
expect "lookup, full server" 0 "img MISS not in the Store" -- --store "$full" lookup $args img
cause_full=${out#img MISS }
n=$((n + 1))
case "$cause_auth" in *WRONGPASS*) ok_a=1 ;; *) ok_a=0 ;; esac
case "$cause_refused" in *"Connection refused"*) ok_r=1 ;; *) ok_r=0 ;; esac
if [ $ok_a -eq 1 ] && [ $ok_r -eq 1 ] && [ "$cause_auth" != "$cause_refused" ] &&
  [ "$cause_full" != "$cause_auth" ] && [ "$cause_full" != "$cause_refused" ]; then
  echo "ok $n - three different causes"
else
  echo "not ok $n - three different causes"; fails=$((fails + 1))
  printf '# %s\n' "$cause_auth" "$cause_refused" "$cause_full"
fi
# shellcheck disable=SC2086
expect "lookup --json, wrong password" 1 '"why": "the existence check' -- --store "$wrong" lookup --json $args img
n=$((n + 1))
if printf '%s' "$out" | grep -q '"why": ".*WRONGPASS'; then echo "ok $n - --json names WRONGPASS"
else echo "not ok $n - --json names WRONGPASS"; echo "$out" | sed 's/^/# /'; fails=$((fails + 1)); fi
n=$((n + 1))
if printf '%s' "$out" | grep -q wrong; then echo "not ok $n - the password shows"; fails=$((fails + 1))
else echo "ok $n - the password does not show"; fi

# --- publish gives the Store's reason, as put does
# shellcheck disable=SC2086
expect "publish, full server" 1 "OOM command not allowed" -- --store "$full" publish $args --id img "$dir/payload"
expect "put, full server" 1 "OOM command not allowed" -- --store "$full" put k "$dir/payload"

# --- the same failure, the same exit status
expect "stats, wrong password" 1 "WRONGPASS" -- --store "$wrong" stats
expect "stats, connection refused" 1 "Connection refused" -- --store "$refused" stats
expect "ls, connection refused" 1 "Connection refused" -- --store "$refused" ls

# --- the demo stops at once with the reason (no baseline, no summary)
for url in "$wrong" "$refused"; do
  expect "demo stops: $url" 1 "cannot use the Store" -- --store "$url" demo --encoders 2 --requests 5 --images 4 --tokens 4 --hidden 8
  n=$((n + 1))
  case "$out" in
  *verification* | *baseline*) echo "not ok $n - demo ran on: $out"; fails=$((fails + 1)) ;;
  *WRONGPASS* | *"Connection refused"*) echo "ok $n - demo names the reason" ;;
  *) echo "not ok $n - demo reason: $out"; fails=$((fails + 1)) ;;
  esac
done
# --- a demo on a Store it was given leaves none of its objects there
plain_port=$(free_port $((refused_port + 1)))
serve plain "$plain_port"
expect "demo on a given Store" 0 "verification" -- --store "redis://127.0.0.1:$plain_port" demo --encoders 2 --requests 10 --images 4 --tokens 4 --hidden 8 --no-baseline
n=$((n + 1))
left=$(redis-cli -p "$plain_port" dbsize)
if [ "$left" = 0 ]; then echo "ok $n - the demo left nothing in the Store"
else echo "not ok $n - the demo left $left objects"; fails=$((fails + 1)); fi
echo "1..$n"
echo "# $n checks, $fails failed"
[ "$fails" -eq 0 ]
