#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# bench-identity.sh [ENCACHE [DIR [MIB [ROUNDS]]]]: the throughput of
# `encache identity` against `cat FILE > /dev/null`, in the same run, on a
# model directory holding one weight file of MIB MiB (default 1024) of
# random bytes, made in a fresh directory under DIR (default /dev/shm, so
# that neither reads a disk; give a disk's directory to measure that disk,
# its page cache warm).  The file is read once first; then ROUNDS rounds
# (default 7) each time cat, then identity.  Prints every round and each
# one's median in GB/s (10^9 bytes per second), and their ratio.  ENCACHE
# defaults to build/encache.  Needs GNU date (nanoseconds).
set -eu
tool=${1:-build/encache}
dir=${2:-/dev/shm}
mib=${3:-1024}
rounds=${4:-7}
work=$(mktemp -d "$dir/encache-identity-bench-XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir "$work/model"
file=$work/model/model.safetensors
head -c "$((mib * 1048576))" /dev/urandom >"$file"
bytes=$((mib * 1048576))
cat "$file" >/dev/null

now() { date +%s%N; }
# gbs NANOSECONDS: bytes / time, in GB/s.
gbs() { awk -v b="$bytes" -v ns="$1" 'BEGIN { printf "%.2f", b / ns }'; }
median() { sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }

: >"$work/cat" && : >"$work/identity"
echo "file: $mib MiB in $dir, $rounds rounds (GB/s)"
i=0
while [ "$i" -lt "$rounds" ]; do
  i=$((i + 1))
  t0=$(now)
  cat "$file" >/dev/null
  t1=$(now)
  id=$("$tool" identity --model-dir "$work/model" --label bench)
  t2=$(now)
  gbs $((t1 - t0)) >>"$work/cat" && echo >>"$work/cat"
  gbs $((t2 - t1)) >>"$work/identity" && echo >>"$work/identity"
  echo "round $i: cat $(tail -n 1 "$work/cat")  identity $(tail -n 1 "$work/identity")"
done
c=$(median <"$work/cat")
h=$(median <"$work/identity")
echo "identity: $id"
echo "median: cat $c GB/s, encache identity $h GB/s, identity/cat $(awk -v h="$h" -v c="$c" 'BEGIN { printf "%.2f", h / c }')"
