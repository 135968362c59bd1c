# SPDX-License-Identifier: Apache-2.0
"""Which way a `mooncake:` Store reaches Mooncake in this process
(docs/stores.md, "Mooncake through its Python client").

libencache's Mooncake backend loads Mooncake's store C ABI:
$ENCACHE_MOONCAKE_LIBRARY, else libmooncake_store.so, which only a
Mooncake built from its sources has.  Mooncake's wheels (pip) have its
Python client instead; for them the package ships the same C ABI over that
client (encache/_libs/libencache_mooncake_py.so, python/mooncake_py/mooncake_py.c),
so the backend, its code table and everything above it are the same code
on either route.  Before a Cache opens a Mooncake Store, route() picks:

  "c-abi"   $ENCACHE_MOONCAKE_LIBRARY names another library, or
            libmooncake_store.so loads: Mooncake's own C ABI;
  "python"  else, when this Python has the package `mooncake`:
            ENCACHE_MOONCAKE_LIBRARY is set to the package's library, and
            ENCACHE_MOONCAKE_PYTHON to this interpreter (the C programs
            started from here, the tool's commands, then take the same
            client);
  "none"    neither: the Store's open fails and says how to get one.

It is said once per process and route in the log ("encache" logger, level
INFO), and is the Cache's `mooncake_route`.  The environment is set on the
first call, on the calling thread, before any Mooncake client exists.
"""
import atexit
import ctypes
import importlib.util
import logging
import os
import sys
import threading
import typing
import weakref

LIBRARY_NAME = "libencache_mooncake_py.so"
_log = logging.getLogger("encache")
_lock = threading.Lock()
_said: typing.Set[str] = set()
_c_abi: typing.Optional[bool] = None  # whether libmooncake_store.so loads
# The Caches on the Python route still open: closed at exit, while the
# interpreter can still run the client's calls of their last writes.
_open: "weakref.WeakSet" = weakref.WeakSet()


def library() -> str:
    """The path of the package's C ABI over Mooncake's Python client."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "_libs",
                        LIBRARY_NAME)


def names_mooncake(url: typing.Optional[str]) -> bool:
    """Whether the Store URL `url` is a Mooncake Store or a tier over one
    (tier:LOCAL+mooncake:...)."""
    if not url:
        return False
    return url.startswith("mooncake:") or (
        url.startswith("tier:") and "+mooncake:" in url)


def _c_abi_loads() -> bool:
    global _c_abi
    if _c_abi is None:
        try:
            ctypes.CDLL("libmooncake_store.so")
            _c_abi = True
        except OSError:
            _c_abi = False
    return _c_abi


def _say(route: str, detail: str) -> None:
    if route not in _said:
        _said.add(route)
        _log.info("encache: Mooncake Store route %s: %s", route, detail)


def route(url: typing.Optional[str] = None) -> typing.Optional[str]:
    """The route a Store URL (None: $ENCACHE_STORE) takes to Mooncake in
    this process, "c-abi", "python" or "none", prepared for the next open
    (see the module); None when the URL names no Mooncake Store."""
    if url is None:
        url = os.environ.get("ENCACHE_STORE")
    if not names_mooncake(url):
        return None
    with _lock:
        lib = os.environ.get("ENCACHE_MOONCAKE_LIBRARY", "")
        if lib and os.path.basename(lib) != LIBRARY_NAME:
            _say("c-abi", lib)
            return "c-abi"
        if not lib and _c_abi_loads():
            _say("c-abi", "libmooncake_store.so")
            return "c-abi"
        if not lib and importlib.util.find_spec("mooncake") is None:
            _say("none", "no libmooncake_store.so, and this Python has no "
                 "package mooncake (pip install mooncake-transfer-engine, "
                 "or mooncake-transfer-engine-non-cuda without CUDA)")
            return "none"
        if not lib:
            lib = library()
            os.environ["ENCACHE_MOONCAKE_LIBRARY"] = lib
            os.environ.setdefault("ENCACHE_MOONCAKE_PYTHON", sys.executable)
        _say("python", "Mooncake's Python client (mooncake.store) through "
             + lib)
        return "python"


def track(cache: typing.Any) -> None:
    """Closes `cache` at exit if it is still open then."""
    with _lock:
        _open.add(cache)


@atexit.register
def _close_all() -> None:
    with _lock:
        caches = list(_open)
    for c in caches:
        try:
            if not c.closed:
                c.close()
        except Exception as e:  # exit goes on: say why this one failed
            _log.warning("encache: closing a Cache at exit: %s", e)
