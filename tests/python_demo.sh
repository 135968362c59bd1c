#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# python_demo.sh BUILD_DIR: runs `python3 -m encache.demo` from the build's
# package (BUILD_DIR/python) with tiny arguments: two spawned encoder
# processes share a private shm Store and encode images derived from
# tests/data/images with a one-layer VisionTransformer.  Passes when the
# demo exits 0 and says "verification passed" with hits checked, skipped
# not-an-image.png with a message, avoided encodes, and removed its shm
# segment; when a run on the directory's files, in bfloat16, prints a JSON
# summary that adds up; and when bad usage exits 2 with a message.  Exits 77 (skipped)
# without a Python that has torch and torchvision, or without the built
# extension.
set -u
build=$(cd "$1" && pwd)
cd "$(dirname "$0")/.."
py=
for p in ${PYTHON:-} python3 /usr/bin/python3; do
  if "$p" -c "import torch, torchvision, PIL" 2>/dev/null; then
    py=$p
    break
  fi
done
if [ -z "$py" ]; then
  echo "skipped: no python3 with torch, torchvision and PIL"
  exit 77
fi
if ! ls "$build"/python/encache/_encache*.so >/dev/null 2>&1; then
  echo "skipped: $build/python/encache has no built extension"
  exit 77
fi
out=$(mktemp)
err=$(mktemp)
trap 'rm -f "$out" "$err"' EXIT
fails=0
fail() {
  echo "FAIL: $*"
  fails=$((fails + 1))
}
demo() {
  PYTHONPATH="$build/python" timeout 300 "$py" -m encache.demo "$@" \
    >"$out" 2>"$err"
}

demo --encoders 2 --requests 6 --images 4 --model-layers 1
rc=$?
cat "$out" "$err"
[ "$rc" -eq 0 ] || fail "the demo exited $rc"
grep -Eq "verification +passed \([1-9][0-9]* hits checked" "$out" ||
  fail "no 'verification passed' with hits checked"
grep -Eq "encodes avoided +[1-9]" "$out" || fail "no encode avoided"
grep -q "skipping .*not-an-image.png" "$err" ||
  fail "not-an-image.png was not skipped with a message"
name=$(sed -n 's|.*sharing shm://\([A-Za-z0-9._-]*\)?.*|\1|p' "$out")
[ -n "$name" ] || fail "no private shm Store named in the output"
[ -n "$name" ] && [ -e "/dev/shm/encache-$name" ] &&
  fail "the shm segment $name was left behind"

# The files of a directory (the two test images, not-an-image.png
# skipped), bfloat16 embeddings, a JSON summary.
demo --encoders 2 --requests 5 --images tests/data/images --model-layers 1 \
  --dtype bfloat16 --verify sample --json
rc=$?
[ "$rc" -eq 0 ] || { cat "$out" "$err"; fail "the --json run exited $rc"; }
"$py" -c '
import json, sys
d = json.load(open(sys.argv[1]))
assert d["verification"]["passed"] is True, d["verification"]
assert d["workload"]["images"] == 2 and d["workload"]["dtype"] == "bfloat16"
assert d["encodes"] + d["encodes_avoided"] == d["images"] > 0, d
assert d["bytes_read"] == d["hits"]["total"] * 50 * 384 * 2, d
assert isinstance(d["store_wait_seconds"], float) and d["store_wait_seconds"] >= 0, d
' "$out" || fail "the JSON summary is not as expected"

for bad in "--encoders 0" "--verify some" "--images no/such/dir" \
  "--model-hidden 100"; do
  # shellcheck disable=SC2086 # the words are the arguments
  demo $bad
  rc=$?
  [ "$rc" -eq 2 ] || fail "'$bad' exited $rc, not 2"
  grep -q "error:" "$err" || fail "'$bad' said no error"
done

[ "$fails" -eq 0 ] && echo "python demo: all checks passed"
[ "$fails" -eq 0 ]
