#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# on_redis.sh ENCACHE_TESTS ENCACHE_TOOL: runs the Store conformance suite
# and the engine's acceptance cases on a real Redis server (over TCP and
# over its Unix socket), on a real three-master Redis Cluster and on a
# server that requires a password, started on free loopback ports for the
# run and stopped after it, at the default window threshold and with
# windows forced for every size (issue 14), then the tool's Store commands
# on them (no output may show the password), purge (issue 16) and the
# demo; the Redis leases (issue 16: a race of processes, a lease never
# listed, counted or purged) and the objects' check (issue 26: flipped
# bytes, copies under another key, objects written without it) on each.  Exits 77 (skipped) without redis-server.
set -u
tests=$1
tool=$2
here=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=tests/redis_up.sh
. "$here/tests/redis_up.sh"
rc=0
for url in "$ENCACHE_REDIS_URL" "$ENCACHE_REDIS_UNIX_URL" \
  "$ENCACHE_REDIS_CLUSTER_URL"; do
  echo "# on $url"
  ENCACHE_TEST_STORE=$url "$tests" store_ engine_ redis_lease_on_ \
    redis_check_on_ device_ lookup_async_ || rc=1
done
# Windows (issue 14) forced for every size: 16 KiB windows, 4 per
# exchange, so that most objects of the suites take several exchanges.
win="window=16KiB&window_depth=4&window_threshold=0"
for url in "$ENCACHE_REDIS_URL?$win" "$ENCACHE_REDIS_UNIX_URL?$win" \
  "$ENCACHE_REDIS_CLUSTER_URL?$win"; do
  echo "# on $url"
  ENCACHE_TEST_STORE=$url "$tests" store_ engine_ redis_check_on_ || rc=1
done
# A server that requires a password (AUTH): the Store suite with the
# password in a file (password_file=), the engine suite with it in the
# environment (ENCACHE_REDIS_PASSWORD).
echo "# on $ENCACHE_REDIS_AUTH_URL, password_file"
ENCACHE_TEST_STORE="$ENCACHE_REDIS_AUTH_URL?password_file=$ENCACHE_REDIS_AUTH_FILE" \
  "$tests" store_ redis_lease_on_ || rc=1
echo "# on $ENCACHE_REDIS_AUTH_URL, ENCACHE_REDIS_PASSWORD"
ENCACHE_REDIS_PASSWORD=$ENCACHE_REDIS_AUTH_PASSWORD \
  ENCACHE_TEST_STORE=$ENCACHE_REDIS_AUTH_URL "$tests" engine_ || rc=1
# The tool's Store commands, on both.
tmp=$(mktemp -d)
printf 'NOOM\000\000\000\000\001\000\000\000\000\000\000\000\001\000\000\000\000\000\000\000\000\000\200\077' > "$tmp/v3"
printf '\000\000\200\077' > "$tmp/payload"
for url in "$ENCACHE_REDIS_URL" "$ENCACHE_REDIS_UNIX_URL" \
  "$ENCACHE_REDIS_CLUSTER_URL"; do
  k="tool-$$-$RANDOM"
  fail() { echo "not ok - tool on $url: $*"; rc=1; }
  "$tool" --store "$url" put "$k" "$tmp/v3" >/dev/null || fail put
  "$tool" --store "$url" put "$k" "$tmp/v3" 2>/dev/null && fail "put replaced"
  "$tool" --store "$url" get "$k" | cmp -s - "$tmp/v3" || fail get
  "$tool" --store "$url" inspect "$k" | grep -q "float32 1x1, 4 payload bytes" || fail inspect
  "$tool" --store "$url" ls "$k" | grep -q "^28.$k\$" || fail ls
  "$tool" --store "$url" stats | grep -q "kind *redis" || fail stats
  "$tool" --store "$url" rm "$k" || fail rm
  "$tool" --store "$url" get "$k" 2>/dev/null && fail "get after rm"
  m="model-$$-$RANDOM"
  "$tool" --store "$url" publish --model "$m" --dtype float32 --rows 1 --cols 1 --id img "$tmp/payload" | grep -q written || fail publish
  "$tool" --store "$url" lookup --model "$m" --dtype float32 --rows 1 --cols 1 img | grep -q "img HIT float32 1 1" || fail lookup
  "$tool" --store "$url" namespaces | grep -q "^1.28.embedding@model:$m@revision:default@encoder:encoder:default@dtype:torch.float32@protocol:v3\$" || fail namespaces
  [ $rc -eq 0 ] && echo "ok - tool commands on $url"
done
# purge (issue 16) on each: 3000 objects of a namespace (more than one
# SCAN page, every slot of the cluster) and a key with pattern
# characters go; the bare namespace, NS@idx, a namespace that starts with
# NS and keys of other programs (a string, a list, a hash) stay, byte for
# byte; a dry run removes nothing; a second purge removes 0.
for url in "$ENCACHE_REDIS_URL" "$ENCACHE_REDIS_UNIX_URL" \
  "$ENCACHE_REDIS_CLUSTER_URL"; do
  case $url in
    unix://*) cli="redis-cli -s ${url#unix://}" ;;
    redis-cluster://*) hp=${url#redis-cluster://}; hp=${hp%%,*}
      cli="redis-cli -c -h ${hp%:*} -p ${hp#*:}" ;;
    *) hp=${url#redis://}; cli="redis-cli -h ${hp%:*} -p ${hp#*:}" ;;
  esac
  bad=0
  fail() { echo "not ok - purge on $url: $*"; bad=1; rc=1; }
  m="purge-$$-$RANDOM"
  ns=$("$tool" key --model "$m" --dtype float32 --namespace)
  nsb=$("$tool" key --prefix "$ns" --model "$m" --dtype float32 --namespace)
  i=0
  while [ $i -lt 3000 ]; do i=$((i + 1)); echo "SET $ns@id:k$i v$i"; done |
    $cli >/dev/null
  for k in "$ns@id:a*[?\\" "$ns" "$ns@idx" "$nsb@id:x"; do
    "$tool" --store "$url" put "$k" "$tmp/v3" >/dev/null || fail "put $k"
  done
  $cli SET "other:$m" "not encache" >/dev/null
  $cli RPUSH "other-list:$m" a b >/dev/null
  $cli HSET "$ns@id-hash" f v >/dev/null
  others() { $cli GET "other:$m"; $cli LRANGE "other-list:$m" 0 -1
    $cli HGETALL "$ns@id-hash"; }
  before=$(others)
  out=$("$tool" --store "$url" purge --namespace-of --model "$m" --dtype float32 --dry-run)
  printf '%s' "$out" | grep -q "would remove 3001 objects" || fail "dry run: $out"
  [ "$("$tool" --store "$url" ls "$ns@id:*" | wc -l)" -eq 3001 ] || fail "the dry run removed"
  out=$("$tool" --store "$url" purge --namespace-of --model "$m" --dtype float32)
  printf '%s' "$out" | grep -q "removed 3001 objects" || fail "purge: $out"
  [ -z "$("$tool" --store "$url" ls "$ns@id:*")" ] || fail "objects of the namespace left"
  for k in "$ns" "$ns@idx" "$nsb@id:x"; do
    "$tool" --store "$url" get "$k" | cmp -s - "$tmp/v3" || fail "$k changed"
  done
  [ "$(others)" = "$before" ] || fail "keys of other programs changed"
  "$tool" --store "$url" purge --namespace-of --model "$m" --dtype float32 |
    grep -q "removed 0 objects" || fail "a second purge"
  # Every key that starts with NS: NS, NS@idx, the other namespace's, the hash.
  "$tool" --store "$url" purge --key-prefix "$ns" | grep -q "removed 4 objects" ||
    fail "--key-prefix"
  $cli DEL "other:$m" >/dev/null; $cli DEL "other-list:$m" >/dev/null
  $cli DEL "$ns@id-hash" >/dev/null
  [ $bad -eq 0 ] && echo "ok - purge on $url"
done
bad=0
for url in "redis://127.0.0.1:1?connect_timeout_ms=300" \
  "redis-cluster://127.0.0.1:1?connect_timeout_ms=300"; do
  for dry in "" --dry-run; do
    "$tool" --store "$url" purge --key-prefix x $dry >/dev/null 2>"$tmp/err"
    [ $? -eq 1 ] && grep -q "refused" "$tmp/err" ||
      { echo "not ok - purge $dry on a dead server $url"; bad=1; rc=1; }
  done
done
[ $bad -eq 0 ] && echo "ok - purge on a dead server or cluster exits 1, says why"

# The tool with the password in the URL (percent-encoded, as a URL
# carries it): the commands work and no output shows the password; a
# wrong one is refused, named redacted.
pw=$ENCACHE_REDIS_AUTH_PASSWORD
enc=$(printf '%s' "$pw" | sed 's/%/%25/g; s/:/%3A/g; s/@/%40/g; s,/,%2F,g')
auth_url="redis://default:$enc@${ENCACHE_REDIS_AUTH_URL#redis://}"
shown="redis://default:***@${ENCACHE_REDIS_AUTH_URL#redis://}"
k="tool-auth-$$"
bad=0
fail() { echo "not ok - tool with a password: $*"; bad=1; rc=1; }
{
  "$tool" --store "$auth_url" put "$k" "$tmp/v3" || fail put
  "$tool" --store "$auth_url" get "$k" >/dev/null || fail get
  "$tool" --store "$auth_url" ls "$k" || fail ls
  "$tool" --store "$auth_url" stats || fail stats
  "$tool" --store "$auth_url" rm "$k" || fail rm
  "$tool" --store "redis://default:wrong-pw@${ENCACHE_REDIS_AUTH_URL#redis://}" \
    stats && fail "a wrong password was accepted"
} >"$tmp/auth-out" 2>&1
grep -qF "$shown" "$tmp/auth-out" || fail "stats does not show $shown"
grep -q "WRONGPASS\|invalid password\|invalid username-password" "$tmp/auth-out" ||
  fail "the wrong password is not reported"
grep -qF -e "$pw" -e "$enc" "$tmp/auth-out" && fail "an output shows the password"
[ $bad -eq 0 ] && echo "ok - tool with a password in the URL, none shown"
[ $bad -eq 0 ] || sed 's/^/#   /' "$tmp/auth-out"

# Errors the tool must report, not hide (issue 19): an empty --store is
# not the default Store; stats on a cluster no node answers names the
# cause; ls of nothing prints nothing (no qsort of NULL under UBSan).
bad=0
fail() { echo "not ok - tool: $*"; bad=1; rc=1; }
"$tool" --store '' stats >/dev/null 2>"$tmp/err"
[ $? -eq 2 ] && grep -q "URL is empty" "$tmp/err" || fail "--store '' accepted"
"$tool" --store "redis-cluster://127.0.0.1:1?connect_timeout_ms=300" stats \
  >/dev/null 2>"$tmp/err"
[ $? -eq 1 ] && grep -q "refused" "$tmp/err" || fail "stats on a dead cluster"
for url in "$ENCACHE_REDIS_URL" "$ENCACHE_REDIS_CLUSTER_URL"; do
  "$tool" --store "$url" ls "no-such-key-$$-*" >"$tmp/out" || fail "ls of nothing on $url"
  [ -s "$tmp/out" ] && fail "ls of nothing on $url printed keys"
done
[ $bad -eq 0 ] && echo "ok - tool errors: empty URL, dead cluster, empty ls"
rm -rf "$tmp"

# The demo, small, every hit verified, on TCP, a Unix socket and the
# cluster, at the default threshold and with windows forced (2 KiB: its
# objects of 8 KiB take 4).
dwin="window=2KiB&window_depth=2&window_threshold=0"
for url in "$ENCACHE_REDIS_URL" "$ENCACHE_REDIS_UNIX_URL" \
  "$ENCACHE_REDIS_CLUSTER_URL" "$ENCACHE_REDIS_URL?$dwin" \
  "$ENCACHE_REDIS_CLUSTER_URL?$dwin"; do
  out=$("$tool" --store "$url" demo --encoders 3 --requests 30 --images 12 \
    --tokens 16 --hidden 128 --verify all --no-baseline 2>&1)
  if [ $? -eq 0 ] && printf '%s' "$out" | grep -q "verification *passed" &&
     ! printf '%s' "$out" | grep -q "encodes avoided *0 "; then
    echo "ok - demo on $url"
  else
    echo "not ok - demo on $url"; printf '%s\n' "$out"; rc=1
  fi
done
exit $rc
