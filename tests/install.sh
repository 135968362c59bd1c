#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# install.sh BUILD_DIR SOURCE_DIR [CFLAGS]: installs the build into a
# scratch prefix and uses it as a project would (ctest `install`):
#   - the files are there (header, libraries, tool, encache.pc, the CMake
#     package, the manual page) and the installed tool runs;
#   - tests/consumer builds with find_package(encache) against both
#     targets (encache::encache, encache::encache_static) and runs; asking
#     for version 2.0 is refused; without jansson's .pc the package says so;
#   - the same program builds with pkg-config, shared and static, and runs;
#   - `man -l`, `MANPATH=... man encache` and `man encache` with PREFIX/bin
#     on PATH render the page, without warnings, options in ASCII;
#   - cmake/uninstall.cmake (the `uninstall` target) leaves no file.
# CFLAGS (a sanitizer build's -fsanitize=...) go to every program built.
set -eu
build=$(cd "$1" && pwd) src=$(cd "$2" && pwd) cflags=${3:-}
work=$(mktemp -d)
prefix=$work/prefix
manifest=$build/install_manifest.txt
seg=encache-install-test-$$

# cmake --install rewrites BUILD_DIR/install_manifest.txt: keep the one of
# a real install from this build folder, and put it back at the end.
[ -f "$manifest" ] && cp "$manifest" "$work/manifest.saved"
cleanup() {
  if [ -f "$work/manifest.saved" ]; then
    cp "$work/manifest.saved" "$manifest"
  else
    rm -f "$manifest"
  fi
  for s in shared static pc pc-static; do
    "$build/encache" shm destroy "$seg-$s" >/dev/null 2>&1 || true
  done
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 1' HUP INT TERM

fail() {
  echo "install.sh: $*" >&2
  exit 1
}
step() { echo "--- $*"; }
# Runs a command, its output kept in $work/log and shown when it fails.
quiet() {
  "$@" >"$work/log" 2>&1 || {
    cat "$work/log" >&2
    fail "failed: $*"
  }
}

step "cmake --install $build --prefix PREFIX"
quiet cmake --install "$build" --prefix "$prefix"
cp "$manifest" "$work/manifest"
config=$(find "$prefix" -name encacheConfig.cmake)
[ -n "$config" ] || fail "no encacheConfig.cmake installed"
libdir=$(dirname "$(dirname "$(dirname "$config")")")
case $libdir in "$prefix"/lib*) ;; *) fail "encacheConfig.cmake in $config" ;; esac
for f in include/encache.h bin/encache share/man/man1/encache.1; do
  [ -f "$prefix/$f" ] || fail "PREFIX/$f was not installed"
done
for f in libencache.so libencache.so.1 libencache.a pkgconfig/encache.pc \
  cmake/encache/encacheConfigVersion.cmake cmake/encache/encacheTargets.cmake; do
  [ -e "$libdir/$f" ] || fail "$libdir/$f was not installed"
done
"$prefix/bin/encache" --version | grep -q '^encache 1\.' ||
  fail "the installed tool does not run"

# The Python package, where the interpreter looks under the prefix; its
# module finds the prefix's library.  (A sanitizer build's module cannot be
# loaded by a plain interpreter.)
if [ -d "$build/python/encache" ] && [ -z "$cflags" ]; then
  step "the Python package imports from PREFIX, with PREFIX's library"
  init=$(find "$prefix" -path '*/encache/__init__.py')
  [ -n "$init" ] || fail "the Python package was not installed"
  [ -f "$(dirname "$init")/demo_images/img0.png" ] ||
    fail "the Python demo's images were not installed"
  PYTHONPATH=$(dirname "$(dirname "$init")") /usr/bin/python3 -c '
import sys, encache
assert encache.__file__.startswith(sys.argv[1]), encache.__file__
libs = [l.split()[-1] for l in open("/proc/self/maps") if "libencache" in l]
assert libs and all(p.startswith(sys.argv[1]) for p in libs), libs
' "$prefix" || fail "the installed Python package does not import"
  step "vLLM finds the connector's plugin in PREFIX (vllm.general_plugins)"
  PYTHONPATH=$(dirname "$(dirname "$init")") /usr/bin/python3 -c '
import importlib.metadata as m, sys
import encache, encache.vllm.connector
eps = [e for e in m.entry_points(group="vllm.general_plugins")
       if e.name == "encache"]
assert len(eps) == 1 and eps[0].value == "encache.vllm:register", eps
assert eps[0].load() is encache.vllm.register
assert m.version("encache") == encache.__version__
assert m.distribution("encache").locate_file("").as_posix().startswith(
    sys.argv[1])
' "$prefix" || fail "the installed package has no vllm.general_plugins entry point"
fi

step "find_package(encache 1.0): encache::encache and encache::encache_static"
quiet cmake -S "$src/tests/consumer" -B "$work/cmake" \
  -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_C_FLAGS="$cflags" \
  -DCMAKE_FIND_PACKAGE_NO_PACKAGE_REGISTRY=ON
grep -q "encache 1\.[0-9.]* in $libdir/cmake/encache" "$work/log" || {
  cat "$work/log"
  fail "find_package did not find the package in the scratch prefix"
}
quiet cmake --build "$work/cmake"
"$work/cmake/consumer_shared" "$seg-shared"
"$work/cmake/consumer_static" "$seg-static"
ldd "$work/cmake/consumer_shared" | grep -q "libencache.so.1 => $libdir/" ||
  fail "consumer_shared does not load PREFIX's libencache.so.1: $(ldd "$work/cmake/consumer_shared")"
if ldd "$work/cmake/consumer_static" | grep -q libencache; then
  fail "consumer_static loads libencache.so"
fi

step "find_package(encache 2.0) is refused (another major version)"
if cmake -S "$src/tests/consumer" -B "$work/cmake2" -DENCACHE_WANT=2.0 \
  -DCMAKE_PREFIX_PATH="$prefix" >"$work/log" 2>&1; then
  fail "find_package(encache 2.0) accepted version 1"
fi
grep -q 'compatible with requested version "2.0"' "$work/log" || {
  cat "$work/log"
  fail "find_package(encache 2.0) failed for another reason"
}

step "find_package(encache) without jansson's .pc names it"
mkdir "$work/no-pc"
if PKG_CONFIG_LIBDIR=$work/no-pc PKG_CONFIG_PATH= cmake -S "$src/tests/consumer" \
  -B "$work/cmake3" -DCMAKE_PREFIX_PATH="$prefix" >"$work/log" 2>&1; then
  fail "find_package(encache) succeeded without jansson"
fi
grep -q 'encache needs jansson' "$work/log" || {
  cat "$work/log"
  fail "no message naming jansson"
}

step "pkg-config, shared and static"
# The .pc file holds the prefix given at configure time; point it here.
pc() {
  PKG_CONFIG_PATH=$libdir/pkgconfig pkg-config \
    --define-variable=prefix="$prefix" "$@" encache
}
[ "$(pc --modversion)" = "$("$prefix/bin/encache" --version | cut -d' ' -f2)" ] ||
  fail "encache.pc's version differs from the tool's"
# shellcheck disable=SC2046,SC2086
quiet cc $cflags -o "$work/pc-shared" "$src/tests/consumer/main.c" \
  $(pc --cflags --libs) -Wl,-rpath,"$libdir"
"$work/pc-shared" "$seg-pc"
# --static lists what libencache.a needs (Libs.private, Requires.private).
# shellcheck disable=SC2046,SC2086
quiet cc $cflags -o "$work/pc-static" "$src/tests/consumer/main.c" \
  $(pc --cflags --static --libs | sed 's/-lencache\b/-l:libencache.a/')
"$work/pc-static" "$seg-pc-static"

step "man encache"
render() {
  LC_ALL=C.UTF-8 MANWIDTH=80 MANPAGER=cat PAGER=cat man --warnings "$@" \
    >"$work/man.txt" 2>"$work/man.err"
  [ ! -s "$work/man.err" ] || {
    cat "$work/man.err" >&2
    fail "man $*: warnings"
  }
  # The page holds every command's --help text, options in ASCII '-'.
  for want in "encache - reuse multimodal encoder outputs" \
    "encache [--store URL] COMMAND [OPTIONS]" \
    "usage: encache key --model M" "usage: encache shm destroy NAME" \
    "ENCACHE_STORE" "Exit status: 0 success" "Print the Store key of an"; do
    grep -qF -- "$want" "$work/man.txt" || {
      cat "$work/man.txt"
      fail "man $*: no line with '$want'"
    }
  done
}
render -l "$prefix/share/man/man1/encache.1"
MANPATH=$prefix/share/man render encache
# With PREFIX/bin on PATH, man-db finds PREFIX/share/man by itself.
(
  unset MANPATH
  PATH=$prefix/bin:$PATH
  render encache
)
# The page and --help come from the same texts: every line of `encache
# --help` (but the usage line, the SYNOPSIS) and of a command's --help.
{
  "$prefix/bin/encache" --help | sed 1d
  "$prefix/bin/encache" key --help
} | grep -v '^$' >"$work/help.txt"
while IFS= read -r line; do
  grep -qF -- "$line" "$work/man.txt" || fail "man encache lacks '$line' of --help"
done <"$work/help.txt"

step "uninstall"
quiet cmake -DMANIFEST="$work/manifest" -P "$src/cmake/uninstall.cmake"
left=$(find "$prefix" \( -type f -o -type l \) -print)
[ -z "$left" ] || fail "left after uninstall: $left"
echo "install.sh: all checks passed"
