# SPDX-License-Identifier: Apache-2.0
"""Every dtype round trips bit for bit, as torch tensors, numpy arrays and
buffers; a hit lands, without a copy, in the memory of the tensor it
returns, which the caller then owns."""
import gc

import numpy as np
import pytest
import torch

import ectest
from ectest import DTYPES, F16, F32, lookup_one, publish_one, sample


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_round_trip_torch(open_cache, dtype):
    a, b = open_cache(dtype=dtype), open_cache(dtype=dtype)
    t = sample(5, 7, dtype)
    publish_one(a, "rt", t)
    r = lookup_one(b, "rt", dtype, (5, 7))
    assert r.hit and isinstance(r.tensor, torch.Tensor)
    x = r.tensor
    assert x.dtype == dtype and tuple(x.shape) == (5, 7)
    assert x.device.type == "cpu" and x.is_contiguous()
    assert torch.equal(x.view(ectest.INT_OF[dtype]),
                       t.view(ectest.INT_OF[dtype]))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_round_trip_numpy(open_cache, dtype):
    a, b = open_cache(dtype=dtype), open_cache(dtype=dtype, output="numpy")
    t = sample(6, 3, dtype)
    publish_one(a, "rt", t)
    r = lookup_one(b, "rt", dtype, (6, 3))
    assert r.hit and isinstance(r.tensor, np.ndarray)
    assert r.tensor.dtype == ectest.NUMPY_OF[dtype]
    assert r.tensor.shape == (6, 3) and r.tensor.flags.c_contiguous
    assert ectest.same_bits(r.tensor, t)
    assert r.tensor.ctypes.data == r.address


def test_round_trip_buffer(open_cache):
    a, b = open_cache(), open_cache(output="buffer")
    t = sample(2, 5)
    publish_one(a, "rt", t)
    r = lookup_one(b, "rt", F32, (2, 5))
    assert r.hit
    view = memoryview(r.tensor)
    assert view.nbytes == t.numel() * t.element_size()
    assert view.tobytes() == t.numpy().tobytes()


@pytest.mark.parametrize("spelling", ["float16", "torch.float16", np.float16,
                                      np.dtype("float16"), F16], ids=str)
def test_dtype_spellings(open_cache, spelling):
    a, b = open_cache(dtype=spelling), open_cache(dtype=F16)
    assert a.namespace == b.namespace and "torch.float16" in a.namespace
    t = sample(2, 2, F16)
    publish_one(a, "sp", t)
    r = lookup_one(b, "sp", spelling, (2, 2))
    assert r.hit and ectest.torch_bits_equal(r.tensor, t)


def test_numpy_publication(open_cache):
    a, b = open_cache(), open_cache()
    arr = np.arange(12, dtype=np.float32).reshape(3, 4)
    rows = np.arange(60, dtype=np.float16).reshape(10, 6)[2:6]  # an offset
    publish_one(a, "np", arr)
    publish_one(a, "rows", rows)
    r = lookup_one(b, "np", F32, (3, 4))
    assert r.hit and np.array_equal(r.tensor.numpy(), arr)
    r = lookup_one(b, "rows", F16, (4, 6))
    assert r.hit and np.array_equal(r.tensor.numpy(), rows)


def test_hit_lands_in_the_returned_tensor(open_cache):
    a, b = open_cache(), open_cache()
    t = sample(16, 16)
    publish_one(a, "zc", t)
    r = lookup_one(b, "zc", F32, (16, 16))
    assert r.hit and isinstance(r.address, int) and r.address != 0
    assert r.tensor.data_ptr() == r.address
    assert r.address % 64 == 0  # docs/python.md: blocks are 64-byte aligned
    # The tensor owns that memory: it outlives its result, step and Cache.
    x = r.tensor
    del r
    gc.collect()
    assert x.data_ptr() != 0 and ectest.torch_bits_equal(x, t)
    # Writing to it changes nothing in the Store.
    x.fill_(7.0)
    again = lookup_one(b, "zc", F32, (16, 16))
    assert again.hit and ectest.torch_bits_equal(again.tensor, t)
    assert again.address == again.tensor.data_ptr() != x.data_ptr()
    b.close()
    assert torch.equal(x, torch.full((16, 16), 7.0))


def test_every_hit_has_its_own_tensor(open_cache):
    """Duplicate ids are read once, and each gets its own destination."""
    a, b = open_cache(), open_cache()
    t = sample(3, 4)
    publish_one(a, "dup", t)
    with b.lookup([("dup", F32, (3, 4))] * 3) as step:
        ptrs = {r.tensor.data_ptr() for r in step}
        assert all(r.hit and r.address == r.tensor.data_ptr() for r in step)
        assert all(ectest.torch_bits_equal(r.tensor, t) for r in step)
    assert len(ptrs) == 3
