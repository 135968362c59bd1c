# SPDX-License-Identifier: Apache-2.0
"""mooncake.store.MooncakeDistributedStore, stood in: the methods that
encache's C ABI over Mooncake's Python client calls (python/mooncake_py/
mooncake_py.c), with the signatures and answers of the real client
(mooncake-transfer-engine 0.3.13.post1) over a table of this process's
own (no master, no transfers, no leases).

For the tests of that library it counts the calls of each method (CALLS)
and answers what INJECT says for a method instead of its own: "raise" (an
exception), "short" (a batch answer one item short), "text" (a batch
answer that is not integers), or an int (the answer, for each key of a
batch).  A client used before a successful setup raises, where the real
one crashes the process (docs/stores.md).
"""
import collections
import ctypes
import re
import threading

OBJECTS = {}  # key -> bytes, shared by every client of the process
CALLS = collections.Counter()
INJECT = {}
_lock = threading.Lock()


def reset():
    with _lock:
        OBJECTS.clear()
        CALLS.clear()
        INJECT.clear()


class MooncakeDistributedStore:
    def __init__(self):
        self._set_up = False
        self._registered = set()

    def _enter(self, name, n=None):
        """Counts the call; the injected answer, or None for none."""
        with _lock:
            CALLS[name] += 1
            what = INJECT.get(name)
        if what == "raise":
            raise RuntimeError(f"stand-in: {name} raises (injected)")
        if what is not None and n is not None:
            return {"short": [0] * (n - 1), "text": ["x"] * n}.get(
                what, [what] * n if isinstance(what, int) else None)
        if isinstance(what, int):
            return what
        if name not in ("setup", "health_check", "close") and \
                not self._set_up:
            raise RuntimeError("stand-in: used before a successful setup "
                               "(the real client crashes the process)")
        return None

    def setup(self, local_hostname, metadata_server, global_segment_size,
              local_buffer_size, protocol, rdma_devices, master_server_addr):
        for v in (local_hostname, metadata_server, protocol, rdma_devices,
                  master_server_addr):
            assert isinstance(v, str), v
        assert isinstance(global_segment_size, int)
        assert isinstance(local_buffer_size, int)
        got = self._enter("setup")
        if got is not None:
            return got
        if master_server_addr.startswith("unreachable"):
            return -1
        self._set_up = True
        return 0

    def health_check(self):
        got = self._enter("health_check")
        return got if got is not None else 0 if self._set_up else 1

    def close(self):
        self._enter("close")
        self._set_up = False
        return 0

    def put_from(self, key, buffer_ptr, size):
        got = self._enter("put_from")
        if got is not None:
            return got
        if not key or size == 0:
            return -600
        data = ctypes.string_at(buffer_ptr, size)
        with _lock:
            OBJECTS.setdefault(key, data)  # never replaced, as Mooncake
        return 0

    def batch_get_into(self, keys, buffer_ptrs, sizes):
        got = self._enter("batch_get_into", len(keys))
        if got is not None:
            return got
        out = []
        for key, ptr, size in zip(keys, buffer_ptrs, sizes):
            with _lock:
                data = OBJECTS.get(key)
            if data is None:
                out.append(-704)
            elif len(data) > size:
                out.append(-600)
            else:
                ctypes.memmove(ptr, data, len(data))
                out.append(len(data))
        return out

    def batch_is_exist(self, keys):
        got = self._enter("batch_is_exist", len(keys))
        if got is not None:
            return got
        with _lock:
            return [1 if k in OBJECTS else 0 for k in keys]

    def get_size(self, key):
        got = self._enter("get_size")
        if got is not None:
            return got
        with _lock:
            data = OBJECTS.get(key)
        return -704 if data is None else len(data)

    def remove(self, key, force=False):
        got = self._enter("remove")
        if got is not None:
            return got
        with _lock:
            return 0 if OBJECTS.pop(key, None) is not None else -704

    def remove_by_regex(self, regex_pattern, force=False):
        got = self._enter("remove_by_regex")
        if got is not None:
            return got
        r = re.compile(regex_pattern)
        with _lock:
            gone = [k for k in OBJECTS if r.search(k)]
            for k in gone:
                del OBJECTS[k]
        return len(gone)

    def register_buffer(self, buffer_ptr, size):
        got = self._enter("register_buffer")
        if got is not None:
            return got
        self._registered.add(buffer_ptr)
        return 0

    def unregister_buffer(self, buffer_ptr):
        got = self._enter("unregister_buffer")
        if got is not None:
            return got
        if buffer_ptr not in self._registered:
            return -600
        self._registered.discard(buffer_ptr)
        return 0
