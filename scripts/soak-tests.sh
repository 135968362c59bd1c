#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# soak-tests.sh [CMAKE ARGS...]: finds timing-dependent tests.  Builds as
# scripts/test.sh does, then runs the whole ctest suite SOAK_RUNS times in
# a row with CPU hogs beside it, and stops at the first failing run.
#
#   SOAK_RUNS=N      runs (default 20; CI does not run this script)
#   SOAK_HOGS=N      busy-loop processes beside the tests, at nice 0
#                    (default: one per CPU, `nproc`; 0 for none)
#   SOAK_TIMEOUT=S   ctest's per-test limit in seconds (default 600)
#   BUILD_DIR=DIR    build directory (default build/)
#   Extra arguments go to cmake, as for scripts/test.sh, e.g.
#   BUILD_DIR=build-tsan sh scripts/soak-tests.sh -DENCACHE_SANITIZE=thread
#
# Each run's output goes to $BUILD_DIR/soak/run-N.log (kept for a failed
# run, removed for a passed one).  On a failure it prints the run number,
# the failed ctest tests and the failed test cases (TAP "not ok" lines,
# with the Store they ran on).  The last line is always
#   soak: P passed, F failed (T s)
# (", interrupted" before the time if it was stopped), and the exit
# status is 0 only if every run passed.  On any exit
# (including Ctrl-C or a kill) it stops what it started: the hogs, the
# ctest run in progress with its processes, and any Redis server that the
# run started (they live in a private TMPDIR, found by their pid files).
set -eu
cd "$(dirname "$0")/.."
runs=${SOAK_RUNS:-20}
hogs=${SOAK_HOGS:-$(nproc)}
limit=${SOAK_TIMEOUT:-600}
build=${BUILD_DIR:-build}

sh scripts/build.sh "$@"

logs="$build/soak"
mkdir -p "$logs"
work=$(mktemp -d "${TMPDIR:-/tmp}/encache-soak.XXXXXX")
hog_pids=""
ctest_pid=""
passed=0
failed=0
start=$(date +%s)
stopped=""

cleanup() {
  trap - EXIT INT TERM HUP
  set +e
  for p in $hog_pids; do kill "$p" 2>/dev/null; done
  if [ -n "$ctest_pid" ]; then
    # ctest runs in a session of its own (setsid): stop all of it.
    env kill -TERM -- "-$ctest_pid" 2>/dev/null
    wait "$ctest_pid" 2>/dev/null
  fi
  # Redis servers daemonize out of that group: stop them by pid file.
  for f in $(find "$work" -name 'redis-*.pid' 2>/dev/null); do
    kill "$(cat "$f")" 2>/dev/null
  done
  for p in $hog_pids; do wait "$p" 2>/dev/null; done
  rm -rf "$work"
  echo "soak: $passed passed, $failed failed$stopped ($(( $(date +%s) - start )) s)"
}
trap cleanup EXIT
trap 'stopped=", interrupted"; exit 130' INT
trap 'stopped=", interrupted"; exit 143' TERM
trap 'stopped=", interrupted"; exit 129' HUP

i=0
while [ "$i" -lt "$hogs" ]; do
  (trap - INT TERM HUP; while :; do :; done) &
  hog_pids="$hog_pids $!"
  i=$((i + 1))
done

run=1
while [ "$run" -le "$runs" ]; do
  log="$logs/run-$run.log"
  t0=$(date +%s)
  # A session (process group) of its own, so that cleanup can stop all of
  # it (setsid does not fork: a background job is no group leader); a
  # private TMPDIR, so that the Redis servers it starts can be found.
  TMPDIR=$work setsid ctest --test-dir "$build" --output-on-failure \
    --timeout "$limit" >"$log" 2>&1 </dev/null &
  ctest_pid=$!
  rc=0
  wait "$ctest_pid" || rc=$?
  ctest_pid=""
  t1=$(date +%s)
  if [ "$rc" -eq 0 ]; then
    passed=$((passed + 1))
    echo "soak: run $run/$runs passed ($((t1 - t0)) s)"
    rm -f "$log"
  else
    failed=$((failed + 1))
    echo "soak: run $run/$runs FAILED ($((t1 - t0)) s, ctest exit $rc); log: $log"
    sed -n '/The following tests FAILED/,$p' "$log"
    grep -E '^(# on |not ok|# .*:[0-9]+: )' "$log" || true
    break
  fi
  run=$((run + 1))
done
[ "$failed" -eq 0 ]
