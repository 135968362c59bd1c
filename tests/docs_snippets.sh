#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# docs_snippets.sh SOURCE_DIR LIBRARY TOOL [CFLAGS]: every C snippet of README.md and
# docs/*.md is compiled, and run when it is a program.
#
# Each ```c block must follow (on the line before it) one of these marks
# (docs/development.md, "Snippets and commands in the docs"):
#   <!-- c: program -->   a whole program: compiled, linked and run, with a
#                         private shm Store URL as its first argument and in
#                         ENCACHE_STORE;
#   <!-- c: body -->      statements that declare everything they use: they
#                         become the body of main() after the usual headers
#                         (encache.h, stdio, stdlib, string), then are
#                         compiled and run like a program (exit status 0);
#   <!-- c: fragment -->  part of something larger (names it does not
#                         declare, "..."): not compiled.
# A block without a mark fails the test, so that no snippet is left
# unchecked by accident.  Compiled with cc -std=c11 -Wall -Wextra -Werror
# against SOURCE_DIR/include, linked with LIBRARY (libencache.so), with
# CFLAGS added (the library's sanitizer flags) and $CC when set; TOOL (the
# encache tool) removes the segments afterwards.
set -u
src=$1
lib=$(cd "$(dirname "$2")" && pwd)/$(basename "$2")
tool=$3
cflags=${4:-}
tmp=$(mktemp -d)
seg="docs-snippet-$$"
trap '"$tool" shm destroy "$seg" >/dev/null 2>&1; rm -rf "$tmp"' EXIT
cc=${CC:-cc}
fails=0
n=0

# extract FILE: writes each ```c block of FILE to $tmp/K-FILE-LINE.KIND.c,
# KIND being the mark's word, or "unmarked".
extract() {
  awk -v out="$tmp" -v name="$(echo "$1" | tr '/' '_')" '
    /^[ \t]*```c[ \t]*$/ && !inside {
      match($0, /^[ \t]*/); indent = RLENGTH
      kind = "unmarked"
      if (match(prev, /^<!-- c: (program|body|fragment) -->$/))
        kind = substr(prev, 9, RLENGTH - 12)
      file = sprintf("%s/%s-%05d.%s.c", out, name, NR, kind)
      inside = 1
      printf "" > file
      next
    }
    inside && /^[ \t]*```[ \t]*$/ { inside = 0; close(file); next }
    inside { print substr($0, indent + 1) > file; next }
    NF { prev = $0; sub(/^[ \t]+/, "", prev) }
  ' "$src/$1"
}

for f in "$src"/README.md "$src"/docs/*.md; do
  extract "${f#"$src"/}"
done

# check NAME SOURCE: compiles SOURCE to a program and runs it.
build_and_run() {
  name=$1 c=$2
  n=$((n + 1))
  # shellcheck disable=SC2086 # CFLAGS is a list of flags
  if ! "$cc" -std=c11 -Wall -Wextra -Werror $cflags -I"$src/include" -o "$tmp/prog" \
      "$c" "$lib" -Wl,-rpath,"$(dirname "$lib")" >"$tmp/log" 2>&1; then
    echo "not ok $n - $name does not compile"
    sed 's/^/# /' "$tmp/log"
    fails=$((fails + 1))
    return
  fi
  url="shm://$seg?size=16MiB"
  "$tool" shm destroy "$seg" >/dev/null 2>&1
  if ! (cd "$tmp" && ENCACHE_STORE=$url ./prog "$url") >"$tmp/log" 2>&1; then
    echo "not ok $n - $name exits with an error"
    sed 's/^/# /' "$tmp/log"
    fails=$((fails + 1))
    return
  fi
  echo "ok $n - $name compiles and runs"
}

programs=0 bodies=0 fragments=0
for c in "$tmp"/*.c; do
  [ -f "$c" ] || continue
  base=$(basename "$c" .c)
  kind=${base##*.}
  file=$(echo "${base%-*}" | sed 's/_/\//')
  line=${base##*-}
  line=$(echo "${line%%.*}" | sed 's/^0*//')
  where="$file line $line"
  case $kind in
  program)
    programs=$((programs + 1))
    { printf '#line %d "%s"\n' $((line + 1)) "$file"; cat "$c"; } >"$tmp/prog.c"
    build_and_run "$where (program)" "$tmp/prog.c"
    ;;
  body)
    bodies=$((bodies + 1))
    {
      printf '#include <encache.h>\n\n#include <stdio.h>\n#include <stdlib.h>\n'
      printf '#include <string.h>\n\nint main(int argc, char **argv) {\n'
      printf '  (void)argc, (void)argv;\n#line %d "%s"\n' $((line + 1)) "$file"
      cat "$c"
      printf '  return 0;\n}\n'
    } >"$tmp/body.c"
    build_and_run "$where (body)" "$tmp/body.c"
    ;;
  fragment)
    fragments=$((fragments + 1))
    ;;
  *)
    n=$((n + 1))
    echo "not ok $n - $where: a C block without <!-- c: program|body|fragment --> before it"
    fails=$((fails + 1))
    ;;
  esac
done
echo "# $programs programs, $bodies bodies compiled and run; $fragments fragments not compiled"
[ "$n" -gt 0 ] || { echo "not ok - no C snippet found under $src"; exit 1; }
echo "1..$n"
[ "$fails" -eq 0 ]
