#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# spdx.sh [--check]: gives every source file the license tag
#
#   /* SPDX-License-Identifier: Apache-2.0 */     (C: .c, .h)
#   # SPDX-License-Identifier: Apache-2.0         (shell, CMake, Python, .in)
#
# as its first line, or its second after a "#!" line, where it is missing;
# a file that has it is left alone, so running it again changes nothing.
# The files: those git tracks, and new ones it does not ignore, named
# *.c *.h *.sh *.py *.cmake *.in CMakeLists.txt, and .ci/run.  Not
# tests/abi/1.0/encache.h: the header exactly as 1.0 shipped, never edited.
#
# --check changes nothing: it lists the files without the tag and exits 1
# when there is one (CI runs it).
set -eu
cd "$(dirname "$0")/.."
tag="SPDX-License-Identifier: Apache-2.0"
check=0
case ${1:-} in
--check) check=1 ;;
"") ;;
*)
  echo "usage: sh scripts/spdx.sh [--check]" >&2
  exit 2
  ;;
esac

sources() {
  git ls-files --cached --others --exclude-standard -- '*.c' '*.h' '*.sh' \
    '*.py' '*.cmake' '*.in' '*CMakeLists.txt' .ci/run |
    grep -vx 'tests/abi/1\.0/encache\.h' | sort -u
}

# The tag counts in the first line, or the second after "#!".
has_tag() {
  head -n 2 "$1" | grep -qF "$tag"
}

# Writes the file with its tag line in place (the mode is kept: the
# content is written back into the same file).
add_tag() {
  case $1 in
  *.c | *.h) line="/* $tag */" ;;
  *) line="# $tag" ;;
  esac
  tmp=$(mktemp)
  if head -n 1 "$1" | grep -q '^#!'; then
    { head -n 1 "$1" && echo "$line" && tail -n +2 "$1"; } >"$tmp"
  else
    { echo "$line" && cat "$1"; } >"$tmp"
  fi
  cat "$tmp" >"$1"
  rm -f "$tmp"
}

git rev-parse --is-inside-work-tree >/dev/null 2>&1 || {
  echo "spdx.sh: not in a git checkout (the file list comes from git)" >&2
  exit 2
}
missing=0
for f in $(sources); do
  [ -f "$f" ] || continue # deleted in the work tree
  has_tag "$f" && continue
  missing=$((missing + 1))
  if [ "$check" = 1 ]; then
    echo "$f: no '$tag' line at the top" >&2
  else
    add_tag "$f"
    echo "spdx.sh: tagged $f"
  fi
done
if [ "$check" = 1 ] && [ "$missing" -gt 0 ]; then
  echo "spdx.sh: $missing files without the tag (run sh scripts/spdx.sh)" >&2
  exit 1
fi
exit 0
