# SPDX-License-Identifier: Apache-2.0
"""Publication: what is skipped and why (never a crash), what is already in
the Store, and the bounds of the queue (writes held by the fault Store so
that what is pending is known)."""
import numpy as np
import pytest
import torch

import ectest
from ectest import F32, lookup_one, publish_one, sample
from encache import Skip


def test_skip_reasons(open_cache):
    c = open_cache()
    items = [("nc", F32, (6, 4)), ("3d", F32, (2, 3)), ("i32", F32, (2, 2)),
             ("i64np", F32, (2, 2)), ("ncnp", F32, (10, 4))]
    with c.lookup(items) as step:
        non_contiguous = torch.randn(4, 6).t()
        assert tuple(non_contiguous.shape) == (6, 4)
        assert not non_contiguous.is_contiguous()
        assert step.publish("nc", non_contiguous) == Skip.NOT_CONTIGUOUS
        assert step.publish("3d", torch.randn(2, 3, 4)) == Skip.NOT_MATRIX
        assert step.publish("never", torch.randn(2, 2)) == Skip.NOT_CANDIDATE
        assert step.publish("i32", torch.zeros(2, 2, dtype=torch.int32)) \
            == Skip.DTYPE
        assert step.publish("i64np", np.zeros((2, 2), np.int64)) == Skip.DTYPE
        columns = np.zeros((10, 6), np.float32)[:, 1:5]  # numpy strides
        assert step.publish("ncnp", columns) == Skip.NOT_CONTIGUOUS
    c.flush()
    st = c.stats()
    assert st.published_queued == 0 and st.published_written == 0
    skipped = {k: v for k, v in st.published_skipped.items() if v}
    assert skipped == {"NOT_CONTIGUOUS": 2, "NOT_MATRIX": 1,
                       "NOT_CANDIDATE": 1, "DTYPE": 2}, skipped


def test_an_object_is_never_replaced(open_cache):
    a, b = open_cache(), open_cache()
    first, second = sample(2, 4, seed=1), sample(2, 4, seed=2)
    steps = [c.lookup([("same", F32, (2, 4))]) for c in (a, b)]
    assert steps[0].publish("same", first) == Skip.QUEUED
    a.flush()
    assert steps[1].publish("same", second) == Skip.QUEUED
    b.flush()
    for s in steps:
        s.close()
    assert a.stats().published_written == 1
    st = b.stats()
    assert st.published_written == 0 and st.published_present == 1
    r = lookup_one(open_cache(), "same", F32, (2, 4))
    assert r.hit and ectest.torch_bits_equal(r.tensor, first)


def test_publish_after_step_close_is_refused(open_cache):
    c = open_cache()
    step = c.lookup([("x", F32, (2, 2))])
    step.close()
    with pytest.raises(ectest.encache.ClosedError):
        step.publish("x", sample(2, 2))


# --------------------------------------------- bounds, with writes held

def test_pending_under_the_same_key(open_cache, shm, fault):
    c = open_cache(shm(scheme="pyfault"))
    fault.hold(fault.WRITES)
    publish_one(c, "k", sample(2, 2), flush=False)
    assert fault.wait_held(fault.WRITES)
    with c.lookup([("k", F32, (2, 2))]) as step:
        assert step.publish("k", sample(2, 2, seed=3)) == Skip.PENDING
    fault.hold(fault.WRITES, False)
    c.flush()
    st = c.stats()
    assert st.published_written == 1 and st.published_skipped["PENDING"] == 1


def test_over_items(open_cache, shm, fault):
    c = open_cache(shm(scheme="pyfault"),
                   ec_transfer_config=ectest.config(store_max_pending_items=1))
    fault.hold(fault.WRITES)
    with c.lookup([("a", F32, (2, 2)), ("b", F32, (2, 2))]) as step:
        assert step.publish("a", sample(2, 2)) == Skip.QUEUED
        assert step.publish("b", sample(2, 2)) == Skip.OVER_ITEMS
        assert c.stats().pending_items == 1
    fault.hold(fault.WRITES, False)
    c.flush()
    assert c.stats().pending_items == 0


def test_views_of_one_storage_are_charged_their_own_bytes(open_cache, shm,
                                                         fault):
    """Row slices of one CPU tensor are copied at the call, each into memory
    of its own: each is charged its own bytes, and the budget counts what
    the copies hold."""
    big = sample(64, 32)
    view_bytes = 16 * 32 * 4
    url = shm(scheme="pyfault")
    c = open_cache(url, ec_transfer_config=ectest.config(
        store_max_pending_bytes=3 * view_bytes))
    fault.hold(fault.WRITES)
    items = [(i, F32, (16, 32)) for i in ("v0", "v1", "v2", "v3")]
    with c.lookup(items) as step:
        for k in range(3):
            assert step.publish(f"v{k}", big[16 * k:16 * k + 16]) \
                == Skip.QUEUED
            assert c.stats().pending_bytes == (k + 1) * view_bytes
        # The budget is full now: a fourth view is refused.
        assert step.publish("v3", big[48:64]) == Skip.OVER_BYTES
    fault.hold(fault.WRITES, False)
    c.flush()
    st = c.stats()
    assert (st.pending_items, st.pending_bytes) == (0, 0)
    assert st.published_written == 3
    reader = open_cache(ectest.shm_of(url))
    r = lookup_one(reader, "v1", F32, (16, 32))
    assert r.hit and ectest.torch_bits_equal(r.tensor, big[16:32])


def test_a_tensor_neither_on_the_cpu_nor_on_cuda_is_refused(open_cache):
    c = open_cache()
    with c.lookup([("m", F32, (2, 2))]) as step:
        with pytest.raises(ectest.encache.InvalidError, match="meta"):
            step.publish("m", torch.empty(2, 2, device="meta"))


# A view outside its storage (the storage shrunk before the call, legal in
# torch and NumPy) is never published: before the fix its bytes were read
# past the storage's end (a crash when it was shrunk to nothing) and served
# as a HIT.  In a child process, so that a crash fails this test alone.
OUTSIDE = r"""
import sys
sys.path.insert(0, sys.argv[1])
import numpy as np, torch
import ectest
from ectest import F32


def shrink(t, nbytes):
    if hasattr(t, "untyped_storage"):
        t.untyped_storage().resize_(nbytes)
    else:  # torch < 2: the storage's size in elements
        t.storage().resize_(nbytes // t.element_size())
    return t


c = ectest.open_cache(sys.argv[2])
cases = {f"torch{keep}": shrink(ectest.sample(64, 64), keep)
         for keep in (0, 16, 64 * 64 * 4 - 4)}
cases["torch-offset"] = shrink(ectest.sample(64, 64)[8:24], 64 * 16 * 4)
a = np.ones(256 * 64, np.float32)
cases["numpy"] = a.reshape(256, 64)[:64]
a.resize(16, refcheck=False)
items = [(k, F32, tuple(v.shape)) for k, v in cases.items()]
with c.lookup(items) as step:
    for k, v in cases.items():
        print("publish", k, step.publish(k, v).name)
c.flush()
with c.lookup(items) as step:
    for k, r in zip(cases, step.results):
        print("lookup", k, r.outcome.name)
c.close()
"""


def test_a_view_outside_its_storage_is_never_published(store):
    import os
    import subprocess
    import sys
    out = subprocess.run(
        [sys.executable, "-c", OUTSIDE, os.path.dirname(__file__), store],
        capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, (out.returncode, out.stderr[-3000:])
    said = sorted(out.stdout.splitlines())
    names = sorted(["torch0", "torch16", f"torch{64 * 64 * 4 - 4}",
                    "torch-offset", "numpy"])
    assert said == sorted([f"publish {k} OUTSIDE_STORAGE" for k in names] +
                          [f"lookup {k} MISS" for k in names]), said
