# SPDX-License-Identifier: Apache-2.0
"""The stand-in for Mooncake's Python client (tests/mooncake_standin),
which the Python suite's tests of the route run on where no Mooncake is
installed, answers as the real client does: the same calls, in the same
order, with the signatures encache's C ABI over the client uses
(python/mooncake_py/mooncake_py.c), give the same answers and bytes on both."""
import ctypes
import importlib.util
import os
import re

import ectest

HERE = os.path.dirname(os.path.abspath(__file__))
STANDIN = os.path.join(HERE, "..", "mooncake_standin", "mooncake", "store.py")
# Every method the C ABI over the client calls (m_names there).
METHODS = ("setup", "health_check", "put_from", "batch_get_into",
           "batch_is_exist", "get_size", "remove", "remove_by_regex",
           "register_buffer", "unregister_buffer", "close")
MiB = 1 << 20


def _standin():
    spec = importlib.util.spec_from_file_location("standin_store", STANDIN)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _calls(client, master, key):
    """The answers of one sequence of calls, and the bytes read."""
    buf = ctypes.create_string_buffer(3 * MiB)
    p = ctypes.addressof(buf)
    ctypes.memmove(p, os.urandom(1000), 1000)
    none, other = key + "-none", key + "-other"
    out = [client.setup("127.0.0.1", "P2PHANDSHAKE", 0, 16 * MiB, "tcp", "",
                        master),
           client.health_check(),
           client.register_buffer(p, 3 * MiB),
           client.put_from(key, p, 1000),
           client.put_from(other, p, 500),
           client.put_from(key, p + 1, 1000),  # present: 0, not replaced
           client.put_from("", p, 10),
           client.batch_is_exist([key, none]),
           client.get_size(key), client.get_size(none),
           client.batch_get_into([key, none], [p + MiB, p + 2 * MiB],
                                 [MiB, MiB]),
           client.batch_get_into([other], [p + 2 * MiB], [10]),  # too small
           client.remove(none),
           client.remove_by_regex("^" + re.escape(other) + "$", True),
           client.batch_is_exist([other]),
           client.unregister_buffer(p),
           client.unregister_buffer(p)]
    out.append(ctypes.string_at(p + MiB, 1000) == ctypes.string_at(p, 1000))
    return out


def test_the_standin_answers_as_the_real_client(mooncake):
    from mooncake.store import MooncakeDistributedStore as Real
    fake = _standin()
    for name in METHODS:
        assert hasattr(Real, name), name
        assert hasattr(fake.MooncakeDistributedStore, name), name
    master = os.environ["MOONCAKE_MASTER"]
    real = Real()
    try:
        got = _calls(real, master, ectest.unique("standin"))
    finally:
        real.close()
    want = _calls(fake.MooncakeDistributedStore(), master,
                  ectest.unique("standin"))
    assert got == want
    assert got[-1] is True
