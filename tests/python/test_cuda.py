# SPDX-License-Identifier: Apache-2.0
"""CUDA items and CUDA outputs, on the fake CUDA runtime the tests build
(tests/fake_cudart.c: host memory behind the runtime's functions, a thread
per stream, failure injection): run.sh points ENCACHE_CUDA_LIBRARY at it.
Debian's torch has no CUDA, so the device arrays here are a small class
with a __cuda_array_interface__ over the fake's device memory, and the
package's device_empty is replaced by one that makes them."""
import ctypes
import gc
import os
import subprocess
import sys
import threading
import weakref

import numpy as np
import pytest

import ectest
from ectest import F32, publish_one, sample
from encache import Outcome, Skip

LIB = os.environ.get("ENCACHE_CUDA_LIBRARY", "")
pytestmark = pytest.mark.skipif(
    "fakecudart" not in os.path.basename(LIB),
    reason="needs ENCACHE_CUDA_LIBRARY naming the fake CUDA runtime")


def runtime():
    rt = ctypes.CDLL(LIB)  # the same handle the library dlopen()s
    rt.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
    rt.cudaFree.argtypes = [ctypes.c_void_p]
    rt.cudaMemcpy.argtypes = [ctypes.c_void_p, ctypes.c_void_p,
                              ctypes.c_size_t, ctypes.c_int]
    rt.cudaStreamCreate.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
    rt.cudaStreamDestroy.argtypes = [ctypes.c_void_p]
    rt.cudaStreamSynchronize.argtypes = [ctypes.c_void_p]
    for name in ("fake_cudart_fail_copy_after", "fake_cudart_hang_events",
                 "fake_cudart_fail_host_memory", "fake_cudart_delay_us"):
        getattr(rt, name).argtypes = [ctypes.c_long]
    return rt


RT = runtime() if "fakecudart" in os.path.basename(LIB) else None
H2D, D2H = 1, 2  # cudaMemcpyKind


class DeviceArray:
    """A rows x cols float32/float16 matrix in (fake) device memory, as
    CuPy and Numba arrays show themselves."""

    def __init__(self, rows, cols, dtype=np.float32, stream=None):
        self.shape, self.dtype = (rows, cols), np.dtype(dtype)
        self.nbytes = rows * cols * self.dtype.itemsize
        p = ctypes.c_void_p()
        assert RT.cudaMalloc(ctypes.byref(p), max(self.nbytes, 1)) == 0
        self.ptr, self.stream = p.value, stream

    @classmethod
    def of(cls, host, stream=None):
        a = cls(*host.shape, dtype=host.dtype, stream=stream)
        src = np.ascontiguousarray(host)
        assert RT.cudaMemcpy(a.ptr, src.ctypes.data, a.nbytes, H2D) == 0
        return a

    @property
    def __cuda_array_interface__(self):
        return {"shape": self.shape, "typestr": self.dtype.str,
                "data": (self.ptr, False), "strides": None, "version": 3,
                "stream": self.stream}

    def host(self):
        out = np.empty(self.shape, self.dtype)
        assert RT.cudaMemcpy(out.ctypes.data, self.ptr, self.nbytes, D2H) == 0
        return out

    def __del__(self):
        RT.cudaFree(self.ptr)


@pytest.fixture(autouse=True)
def fake(monkeypatch):
    """Every fault of the fake off around each test, and device_empty
    making DeviceArrays (made lists them)."""
    made = []

    def device_empty(code, rows, cols, index):
        a = DeviceArray(rows, cols, np.float16 if code == 1 else np.float32)
        made.append((a, index))
        return (a, a.ptr, 0)

    def reset():
        RT.fake_cudart_fail_copy_after(-1)
        RT.fake_cudart_hang_events(0)
        RT.fake_cudart_fail_host_memory(0)
        RT.fake_cudart_delay_us(0)

    reset()
    monkeypatch.setattr(ectest.encache._tensors, "device_empty", device_empty)
    yield made
    reset()


def test_cuda_output_published_then_read_into_cuda(open_cache, fake):
    c = open_cache()
    want = sample(6, 8, seed=3).numpy()
    with c.lookup([("img", F32, (6, 8), "cuda:0")]) as step:
        assert step[0].outcome == Outcome.MISS
        assert step.publish("img", DeviceArray.of(want)) == Skip.QUEUED
    c.flush()
    st = c.stats()
    assert st.published_written == 1 and st.device_published == 1
    # On the host, from another Cache: the device bytes, bit for bit.
    r = ectest.lookup_one(open_cache(), "img", F32, (6, 8))
    assert r.hit and r.tensor.numpy().tobytes() == want.tobytes()
    # Into the device: the destination device_empty made, filled.
    d = open_cache()
    with d.lookup([("img", F32, (6, 8), "cuda:0"),
                   ("absent", F32, (6, 8), "cuda:0")]) as step:
        hit, miss = step
        assert hit.hit and miss.outcome == Outcome.MISS
        assert isinstance(hit.tensor, DeviceArray)
        assert hit.address == hit.tensor.ptr
        assert hit.tensor.host().tobytes() == want.tobytes()
        assert miss.tensor is None
    assert d.stats().device_bytes_copied == want.nbytes


def test_host_and_cuda_items_of_one_lookup(open_cache):
    c = open_cache()
    outs = {f"k{i}": sample(4, 4, seed=i) for i in range(4)}
    with c.lookup([(k, F32, (4, 4)) for k in outs]) as step:
        for k, t in outs.items():
            assert step.publish(k, t) == Skip.QUEUED
    c.flush()
    items = [("k0", F32, (4, 4)), ("k1", F32, (4, 4), "cuda"),
             ("k1", F32, (4, 4), "cuda:0"), ("k2", F32, (4, 4), "cpu"),
             ("k3", F32, (4, 4), 0)]
    with c.lookup(items) as step:
        assert [r.outcome for r in step] == [Outcome.HIT] * 5
        for r in step:
            got = r.tensor.host() if isinstance(r.tensor, DeviceArray) \
                else r.tensor.numpy()
            assert got.tobytes() == outs[r.id].numpy().tobytes(), r.id
        # The duplicate got its own destination.
        assert step[1].address != step[2].address


def test_one_cuda_device_per_lookup(open_cache):
    c = open_cache()
    with pytest.raises(ectest.encache.InvalidError, match="item 1.*cuda:1"):
        c.lookup([("a", F32, (2, 2), "cuda:0"), ("b", F32, (2, 2), "cuda:1")])
    assert c.stats().lookups == 0  # refused before the library saw it


def test_no_cuda_tensor_for_a_hit(open_cache, monkeypatch):
    c = open_cache()
    publish_one(c, "x", sample(2, 2))
    monkeypatch.setattr(ectest.encache._tensors, "device_empty",
                        lambda *a: None)
    # A miss needs no destination.
    with c.lookup([("absent", F32, (2, 2), "cuda:0")]) as step:
        assert step[0].outcome == Outcome.MISS
    with pytest.raises(ectest.encache.InvalidError,
                       match="item 1: a hit on cuda:0.*no CUDA tensor"):
        c.lookup([("absent", F32, (2, 2)), ("x", F32, (2, 2), "cuda:0")])
    # The Cache is healthy: a host lookup still hits.
    assert ectest.lookup_one(c, "x", F32, (2, 2)).hit


def test_the_real_device_empty_without_cuda_in_torch(open_cache, monkeypatch):
    """Debian's torch has no CUDA: the package's own device_empty says
    so by returning None."""
    monkeypatch.undo()
    import torch
    assert not torch.cuda.is_available()
    assert ectest.encache._tensors.device_empty(0, 2, 2, 0) is None


def test_publication_on_a_stream_of_the_caller(open_cache):
    c = open_cache()
    s = ctypes.c_void_p()
    assert RT.cudaStreamCreate(ctypes.byref(s)) == 0
    try:
        RT.fake_cudart_delay_us(2000)  # copies lag: ordering matters
        want = sample(16, 16, seed=9).numpy()
        with c.lookup([("s", F32, (16, 16), "cuda:0")]) as step:
            assert step.publish("s", DeviceArray.of(want, s.value)) \
                == Skip.QUEUED
        c.flush()
    finally:
        RT.cudaStreamSynchronize(s)
        RT.cudaStreamDestroy(s)
    r = ectest.lookup_one(c, "s", F32, (16, 16))
    assert r.hit and r.tensor.numpy().tobytes() == want.tobytes()


def test_a_full_pinned_pool_is_a_skip(open_cache):
    c = open_cache(options={"cross_encoder_cache": True,
                            "device_pinned_pool_bytes": 4096})
    with c.lookup([("big", F32, (64, 64), "cuda:0")]) as step:  # 16 KiB
        a = DeviceArray.of(np.ones((64, 64), np.float32))
        assert step.publish("big", a) == Skip.OVER_BYTES
    c.flush()
    assert c.stats().device_pool_full == 1


def test_a_failed_device_copy_poisons(open_cache, fake):
    c = open_cache()
    publish_one(c, "p", sample(8, 8))
    publish_one(c, "q", sample(8, 8))
    RT.fake_cudart_delay_us(200000)  # the first copy is still queued ...
    RT.fake_cudart_fail_copy_after(1)  # ... when the second is refused
    with pytest.raises(ectest.encache.PoisonedError):
        c.lookup([("p", F32, (8, 8), "cuda:0"), ("q", F32, (8, 8), "cuda:0")])
    assert c.stats().poisoned
    # A copy may still write the destinations: the binding keeps them
    # (never freed, as the library keeps its own buffers).
    alive = [weakref.ref(a) for a, _ in fake]
    fake.clear()
    gc.collect()
    assert alive and all(r() is not None for r in alive), \
        "destinations freed while a copy may write them"
    RT.cudaDeviceSynchronize()
    with pytest.raises(ectest.encache.PoisonedError):
        c.lookup([("p", F32, (8, 8))])


def test_started_lookup_of_host_and_cuda_items(open_cache, fake):
    """wait=False: the CUDA destinations are made at the call; the
    Results are the blocking lookup's, bit for bit."""
    c = open_cache()
    outs = {f"k{i}": sample(4, 4, seed=i) for i in range(3)}
    with c.lookup([(k, F32, (4, 4)) for k in outs]) as step:
        for k, t in outs.items():
            assert step.publish(k, t) == Skip.QUEUED
    c.flush()
    items = [("k0", F32, (4, 4), "cuda:0"), ("k1", F32, (4, 4)),
             ("k0", F32, (4, 4), "cuda:0"), ("none", F32, (4, 4), "cuda:0"),
             ("k2", F32, (2, 8), "cuda:0")]

    def seen(step):
        return [(r.id, r.outcome, r.why,
                 None if r.tensor is None else
                 (r.tensor.host() if isinstance(r.tensor, DeviceArray)
                  else r.tensor.numpy()).tobytes()) for r in step]

    with c.lookup(items) as step:
        blocking = seen(step)
    fake.clear()
    step = c.lookup(items, wait=False)
    assert len(fake) == 4  # one destination per CUDA item, at the call
    assert step.wait(ectest.TIMEOUT)
    assert seen(step) == blocking
    assert [r.outcome for r in step] == [
        Outcome.HIT, Outcome.HIT, Outcome.HIT, Outcome.MISS,
        Outcome.INCOMPATIBLE]
    assert step[0].address != step[2].address
    assert {step[0].tensor.ptr, step[2].tensor.ptr} == \
        {fake[0][0].ptr, fake[1][0].ptr}
    step.close()


def test_started_lookup_without_a_cuda_tensor_for_a_hit(open_cache,
                                                        monkeypatch):
    c = open_cache()
    publish_one(c, "x", sample(2, 2))
    monkeypatch.setattr(ectest.encache._tensors, "device_empty",
                        lambda *a: None)
    step = c.lookup([("absent", F32, (2, 2)), ("x", F32, (2, 2), "cuda:0")],
                    wait=False)
    with pytest.raises(ectest.encache.InvalidError,
                       match="item 1: a hit on cuda:0.*no CUDA tensor"):
        step.wait()
    assert step.wait(0) and step.results == []
    step.close()
    assert ectest.lookup_one(c, "x", F32, (2, 2)).hit


def test_closing_a_started_cuda_lookup_drops_its_destinations(open_cache,
                                                              fake):
    c = open_cache()
    publish_one(c, "p", sample(8, 8))
    RT.fake_cudart_delay_us(100000)  # the copy lags: still running
    step = c.lookup([("p", F32, (8, 8), "cuda:0"),
                     ("q", F32, (8, 8), "cuda:0")], wait=False)
    alive = [weakref.ref(a) for a, _ in fake]
    fake.clear()
    step.close()  # waits for the copy, then gives the lookup up
    gc.collect()
    assert len(alive) == 2 and all(r() is None for r in alive), \
        "destinations of a given-up lookup kept"
    assert not c.stats().poisoned


def test_started_lookup_reaps_on_the_lookup_thread(open_cache, shm, fault):
    """A started lookup reaps finished publications on the library's
    lookup thread: the reference that kept a CUDA output alive is dropped
    there (with the GIL), and the Cache carries on."""
    c = open_cache(shm(scheme="pyfault"))
    out = DeviceArray.of(sample(4, 4, seed=2).numpy())
    freed = []
    weakref.finalize(out, lambda: freed.append(threading.get_ident()))
    with c.lookup([("d", F32, (4, 4), "cuda:0")]) as step:
        assert step.publish("d", out) == Skip.QUEUED
    del out
    assert fault.wait_finished(fault.WRITES)  # written, not yet reaped
    gc.collect()
    assert freed == []
    step = c.lookup([("d", F32, (4, 4))], wait=False)
    assert step.wait(ectest.TIMEOUT)
    assert step[0].hit
    assert len(freed) == 1 and freed[0] != threading.get_ident()
    step.close()
    assert c.stats().published_written == 1


NO_RUNTIME = r"""
import sys
import numpy as np
sys.path.insert(0, sys.argv[1])
import ectest
from ectest import F32
c = ectest.open_cache(sys.argv[2])
step = c.lookup([("x", F32, (2, 2), "cuda:0"), ("y", F32, (2, 2))])
r = step[0]
print(r.outcome.name, "|", r.why)
# A SKIPPED item is no candidate: a CUDA output for it is NOT_CANDIDATE.
assert step.publish("x", np.zeros((2, 2), np.float32)).name == "NOT_CANDIDATE"
class A:
    __cuda_array_interface__ = {"shape": (2, 2), "typestr": "<f4",
                                "data": (4096, False), "version": 3}
try:
    step.publish("y", A())  # a host item, its output on a GPU
except ectest.encache.LibraryError as e:
    print("LibraryError |", e)
c.close()
"""


def test_without_a_cuda_runtime(store, tmp_path):
    env = dict(os.environ,
               ENCACHE_CUDA_LIBRARY=str(tmp_path / "libcudart-absent.so"))
    out = subprocess.run(
        [sys.executable, "-c", NO_RUNTIME, os.path.dirname(__file__), store],
        env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lookup, publish = out.stdout.strip().splitlines()
    assert lookup.startswith("SKIPPED | CUDA runtime not available")
    assert "libcudart-absent.so" in lookup
    assert publish.startswith("LibraryError |") and "CUDA" in publish
