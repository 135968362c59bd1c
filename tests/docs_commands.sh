#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# docs_commands.sh ENCACHE SOURCE_DIR: runs the commands of docs/deploy.md
# and docs/troubleshooting.md as a reader would, and fails on any error.
#
# Every ```console or ```sh block of those files follows (on the line before
# it) one of these marks (docs/development.md, "Snippets and commands in
# the docs"):
#   <!-- test -->             run here;
#   <!-- not run: REASON -->  not run (it needs vLLM, a Mooncake Store, a
#                             container runtime); keep these few.
# A block without a mark fails the test.  In a block, a line "$ CMD" is a
# command (a line ending in "\" continues it, and so do the lines of a
# here-document up to its end word); the lines after it are what it prints:
# each must appear in its output (standard output and error together, runs
# of blanks squeezed), except "..." lines, which stand for anything.  A
# command must exit 0, unless its output ends with "(exit N)".
#
# The commands of one file run in one shell, in a fresh directory, in
# order (exports and files carry over), with "encache" being ENCACHE and
# these substitutions, applied to commands and outputs alike:
#   - shm segments "encoders", "encache" and "broken" get a private suffix, and
#     "size=8GiB" becomes "size=32MiB" (no 8 GiB reservation on a test
#     machine); ENCACHE_STORE starts as a private segment, so that no
#     command touches the host's default Store;
#   - the hosts 10.0.0.11-13 become 127.0.0.1 and the ports 7001-7003 free
#     loopback ports (the Redis servers a block starts are shut down at the
#     end); the host 10.0.0.20 (a Mooncake master, never contacted) stays.
# Exits 77 (skipped) without redis-server.
set -u
tool=$1
src=$2
case $tool in /*) ;; *) tool=$(pwd)/$tool ;; esac
if ! command -v redis-server >/dev/null || ! command -v redis-cli >/dev/null; then
  echo "skipped: redis-server is not installed"
  exit 77
fi
_dc_tmp=$(mktemp -d)
tag="docs$$"
mkdir "$_dc_tmp/bin" "$_dc_tmp/work"
ln -s "$tool" "$_dc_tmp/bin/encache"

. "$src/scripts/ports.sh"
# Below the ephemeral range (32768 and up), bus ports included, so that no
# client's local port takes one between the check and the server's bind.
base=$((10000 + $$ % 12000))
p1=$(free_port "$base")
p2=$(free_port $((p1 + 1)))
p3=$(free_port $((p2 + 1)))

cleanup() {
  for p in $p1 $p2 $p3; do
    if [ -f "$_dc_tmp/work/deploy/redis.pass" ]; then
      REDISCLI_AUTH=$(cat "$_dc_tmp/work/deploy/redis.pass") redis-cli -p "$p" shutdown nosave
    else
      redis-cli -p "$p" shutdown nosave
    fi
  done >/dev/null 2>&1
  for s in encoders encache broken default; do
    "$tool" shm destroy "$s-$tag" >/dev/null 2>&1
  done
  rm -rf "$_dc_tmp"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

subst() {
  sed -e "s#\(shm://\|destroy \|destroyed \|/dev/shm/encache-\)\(encoders\|encache\|broken\)\b#\1\2-$tag#g" \
    -e 's#size=8GiB#size=32MiB#g' \
    -e 's#10\.0\.0\.1[123]#127.0.0.1#g' \
    -e "s#\b7001\b#$p1#g; s#\b7002\b#$p2#g; s#\b7003\b#$p3#g"
}

# to_script FILE: the commands of FILE as a script of cmd_run calls.
to_script() {
  awk -v file="$1" '
    function flush() {
      if (cmd == "") return
      printf "_dc_cmd_line=%d\ncat >\"$_dc_tmp/cmd\" <<'\''__DOC_CMD__'\''\n%s\n__DOC_CMD__\n", cmdline, cmd
      printf "cat >\"$_dc_tmp/want\" <<'\''__DOC_WANT__'\''\n%s__DOC_WANT__\n", want
      printf "cmd_run %d\n", status
      cmd = ""; want = ""; status = 0
    }
    /^[ \t]*```(console|sh)[ \t]*$/ && !inside {
      inside = 1; run = 0; heredoc = ""; cont = 0
      match($0, /^[ \t]*/); indent = RLENGTH
      if (prev == "<!-- test -->") run = 1
      else if (prev ~ /^<!-- not run: .+ -->$/) {
        printf "not_run %d %s\n", NR, "\"" substr(prev, 15, length(prev) - 18) "\""
      } else
        printf "unmarked %d\n", NR
      next
    }
    inside && /^[ \t]*```[ \t]*$/ { inside = 0; if (run) flush(); next }
    inside && run {
      $0 = substr($0, indent + 1)
      if (heredoc != "") {
        cmd = cmd "\n" $0
        if ($0 == heredoc) heredoc = ""
        next
      }
      if (cont) {
        cmd = cmd "\n" $0
        cont = ($0 ~ /\\$/)
        next
      }
      if (substr($0, 1, 2) == "$ ") {
        flush()
        cmd = substr($0, 3); cmdline = NR
        cont = ($0 ~ /\\$/)
        if (match($0, /<<[ \t]*'\''?[A-Za-z_]+'\''?/)) {
          heredoc = substr($0, RSTART + 2, RLENGTH - 2)
          gsub(/[ \t'\'']/, "", heredoc)
        }
        next
      }
      if ($0 ~ /^\(exit [0-9]+\)$/) { status = substr($0, 7) + 0; next }
      if ($0 == "...") next
      want = want $0 "\n"
      next
    }
    NF { prev = $0; sub(/^[ \t]+/, "", prev) }
  ' "$src/$1" | subst
}

_dc_fails=0
_dc_n=0
_dc_nr=0

# cmd_run STATUS: runs $_dc_tmp/cmd in this shell; checks status and output.
cmd_run() {
  _dc_n=$((_dc_n + 1))
  # shellcheck disable=SC1091 # written by the generated script
  . "$_dc_tmp/cmd" >"$_dc_tmp/out" 2>&1 </dev/null
  _dc_got=$?
  squeeze() { tr '\t' ' ' | tr -s ' '; }
  squeeze <"$_dc_tmp/out" >"$_dc_tmp/out.sq"
  # shellcheck disable=SC2154 # _dc_cmd_line is set by the generated script
  _dc_what="$_dc_doc line $_dc_cmd_line: $(head -n 1 "$_dc_tmp/cmd")"
  _dc_missing=""
  while IFS= read -r _dc_line; do
    _dc_line=$(printf '%s' "$_dc_line" | squeeze)
    [ -z "$_dc_line" ] && continue
    grep -qF -- "$_dc_line" "$_dc_tmp/out.sq" || _dc_missing="$_dc_line"
  done <"$_dc_tmp/want"
  if [ "$_dc_got" -ne "$1" ]; then
    echo "not ok $_dc_n - $_dc_what: exit $_dc_got, expected $1"
  elif [ -n "$_dc_missing" ]; then
    echo "not ok $_dc_n - $_dc_what: output lacks '$_dc_missing'"
  else
    echo "ok $_dc_n - $_dc_what"
    return 0
  fi
  sed 's/^/#   /' "$_dc_tmp/out"
  _dc_fails=$((_dc_fails + 1))
}

not_run() {
  _dc_nr=$((_dc_nr + 1))
  echo "# not run: $_dc_doc line $1 ($2)"
}

unmarked() {
  _dc_n=$((_dc_n + 1))
  echo "not ok $_dc_n - $_dc_doc line $1: a command block without <!-- test --> or <!-- not run: REASON -->"
  _dc_fails=$((_dc_fails + 1))
}

for _dc_doc in docs/deploy.md docs/troubleshooting.md; do
  # The default segment exists, as on a machine where encache was tried,
  # so that the documented way of removing it has something to remove.
  "$tool" --store "shm://encache-$tag?size=1MiB" put probe /dev/null >/dev/null 2>&1
  [ -f "$src/$_dc_doc" ] || { echo "not ok - $_dc_doc is missing"; _dc_fails=$((_dc_fails + 1)); continue; }
  to_script "$_dc_doc" >"$_dc_tmp/script.sh"
  work="$_dc_tmp/work/$(basename "$_dc_doc" .md)"
  mkdir -p "$work"
  (
    cd "$work" || exit 1
    PATH=$_dc_tmp/bin:$PATH
    ENCACHE_STORE="shm://default-$tag?size=16MiB"
    export PATH ENCACHE_STORE
    unset ENCACHE_REDIS_PASSWORD REDISCLI_AUTH MOONCAKE_CONFIG_PATH
    # A watchdog: a command that hangs (a server that never came up) ends
    # this file's run after 300 s instead of the test's.
    _dc_me=$BASHPID
    (
      trap 'kill "$s" 2>/dev/null; exit 0' TERM
      sleep 300 &
      s=$!
      wait "$s"
      kill -KILL "$_dc_me"
    ) >/dev/null 2>&1 &
    _dc_dog=$!
    # shellcheck disable=SC1091 # generated by to_script
    . "$_dc_tmp/script.sh"
    kill "$_dc_dog"
    echo "$_dc_n $_dc_fails $_dc_nr" >"$_dc_tmp/counts"
  )
  if ! read -r _dc_dn _dc_dfails _dc_dnot <"$_dc_tmp/counts" 2>/dev/null; then
    _dc_n=$((_dc_n + 1))
    echo "not ok $_dc_n - $_dc_doc: a command was still running after 300 s (killed)"
    _dc_dn=$_dc_n _dc_dfails=$((_dc_fails + 1)) _dc_dnot=$_dc_nr
  fi
  rm -f "$_dc_tmp/counts"
  _dc_n=$_dc_dn _dc_fails=$_dc_dfails _dc_nr=$_dc_dnot
done
echo "# $_dc_n commands run, $_dc_fails failed; $_dc_nr blocks not run (marked)"
echo "1..$_dc_n"
[ "$_dc_fails" -eq 0 ]
