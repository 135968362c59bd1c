# SPDX-License-Identifier: Apache-2.0
# tap.sh: the TAP helpers of the bash test scripts (sourced by
# tests/fleet_hostile.sh and tests/fleet_tools.sh once they have set
# $tool, the tool under test, and $tmp, a scratch directory).  The script
# ends with `[ "$fails" -eq 0 ]`.
fails=0
n=0
ok() { n=$((n + 1)); echo "ok $n - $1"; }
# not_ok NAME [FILE]: a failure, with FILE's lines as TAP comments.
not_ok() {
  n=$((n + 1)); fails=$((fails + 1)); echo "not ok $n - $1"
  [ -n "${2:-}" ] && [ -f "$2" ] && sed 's/^/# /' "$2"
  return 0
}
# expect NAME STATUS NEEDLE -- ARGS...: the tool's exit status and a piece
# of its output, within 20 s (124: it hung).
expect() {
  local name=$1 want=$2 needle=$3 got
  shift 4
  timeout 20 "$tool" "$@" >"$tmp/out" 2>&1
  got=$?
  if [ "$got" -eq 124 ]; then not_ok "$name: hung (killed after 20 s)" "$tmp/out"
  elif [ "$got" -ne "$want" ]; then not_ok "$name: exit $got, expected $want" "$tmp/out"
  elif ! grep -qF -- "$needle" "$tmp/out"; then not_ok "$name: no '$needle'" "$tmp/out"
  else ok "$name"; fi
}
