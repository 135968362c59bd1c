#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# pip-check.sh [PYTHON]: the pip route of docs/python.md, checked from
# scratch.  With PYTHON (default: `python3` on PATH, not Debian's
# /usr/bin/python3), in a fresh virtual environment without torch:
#   `pip wheel .` (the build `pip install .` makes), whose libraries and
#   tool need nothing outside the wheel but the C library (ldd); pip
#   install of that wheel; import encache and the vLLM connector's module;
#   `encache --help`; the plugin's entry point.
# With ENCACHE_WHEEL_OUT=DIR the wheel is kept in DIR (CI installs it in
# its other virtual environments instead of building it again: see
# ENCACHE_WHEEL in scripts/vllm-venv.sh).
# Needs the build dependencies of scripts/install-deps.sh (a C compiler,
# the -dev packages of jansson, hiredis and xxHash) and the Python package
# index (scikit-build-core, pinned in pyproject.toml).
set -euo pipefail
cd "$(dirname "$0")/.."
py=${1:-python3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "pip-check: $("$py" --version) ($(command -v "$py"))"
"$py" -m venv "$work/venv"
pip=("$work/venv/bin/python" -m pip)
"${pip[@]}" wheel -q --no-deps . -w "$work/wheel"
whl=$(ls "$work"/wheel/encache-*.whl)
echo "pip-check: $(basename "$whl") ($(du -k "$whl" | cut -f1) KiB)"
"${pip[@]}" install -q "$whl"
(cd "$work" && "$work/venv/bin/python" -c '
import encache, encache.vllm.connector
print("pip-check: import encache", encache.__version__, "and encache.vllm.connector: ok")')
"$work/venv/bin/encache" --help | head -n 1
"$work/venv/bin/encache" key --help >/dev/null
# The plugin entry point vLLM looks for, from the installed metadata.
"$work/venv/bin/python" -c '
from importlib.metadata import entry_points
eps = [e.value for e in entry_points(group="vllm.general_plugins") if e.name == "encache"]
assert eps == ["encache.vllm:register"], eps
print("pip-check: entry point vllm.general_plugins: encache =", eps[0])'
mkdir "$work/unpacked"
(cd "$work/unpacked" && "$work/venv/bin/python" -m zipfile -e "$whl" .)
chmod +x "$work/unpacked/encache/_bin/encache"
status=0
for f in "$work"/unpacked/encache/_encache*.so "$work"/unpacked/encache/_libs/*.so* \
         "$work/unpacked/encache/_bin/encache"; do
  deps=$(ldd "$f")
  if grep -q "not found" <<<"$deps"; then
    echo "pip-check: $f: a library not found:" >&2
    grep "not found" <<<"$deps" >&2
    status=1
  fi
  # jansson, hiredis and xxHash come from the wheel itself.
  if grep -E 'jansson|hiredis|xxhash|libencache' <<<"$deps" | grep -v "$work/unpacked" >&2; then
    echo "pip-check: $f uses a library from outside the wheel" >&2
    status=1
  fi
done
[ "$status" = 0 ] || exit "$status"
echo "pip-check: the wheel needs nothing outside it but the C library"
if [ -n "${ENCACHE_WHEEL_OUT:-}" ]; then
  mkdir -p "$ENCACHE_WHEEL_OUT"
  cp "$whl" "$ENCACHE_WHEEL_OUT/"
  echo "pip-check: kept in $ENCACHE_WHEEL_OUT/$(basename "$whl")"
fi
