# SPDX-License-Identifier: Apache-2.0
"""Interop with vLLM's own reuse code on a real Mooncake Store (issue 43):
vLLM's embedding Store (vllm/distributed/ec_transfer/ec_connector/
mooncake_store_embedding: backend.py's MooncakeEmbeddingStoreBackend over
store_client.py's client, as the reference connector builds it) writes
outputs that encache reads, and reads outputs that encache writes, bit for
bit, at 16 KiB, 1 MiB and 8 MiB in float32, float16 and bfloat16; and the
objects the two write for the same output are the same bytes, header
included.  encache takes the route its process has (Mooncake's Python
client here).  Runs with a Python that has vLLM (tests/mooncake_real.sh
runs it with scripts/vllm-venv.sh's); skipped elsewhere."""
import os
import time

import pytest
import torch

import ectest
from ectest import BF16, F16, F32, unique
from encache import Outcome

try:
    from vllm.distributed.ec_transfer.ec_connector.mooncake_store_embedding \
        import backend as vllm_backend, data as vllm_data, \
        store_client as vllm_client
except ImportError as e:  # the Python of tests/mooncake_real.sh's venv
    pytest.skip(f"vLLM's embedding Store is not importable here ({e}); "
                "tests/mooncake_real.sh runs this file with vLLM's Python",
                allow_module_level=True)

SIZES = [(64, 64), (512, 512), (2048, 1024)]  # of float32: 16 KiB to 8 MiB
DTYPES = [F32, F16, BF16]


@pytest.fixture(scope="module")
def ns_cache(mooncake_module):
    """An encache Cache on the Store, with a namespace of this run's own."""
    c = ectest.open_cache(mooncake_module, model=unique("interop-model"))
    assert c.mooncake_route == os.environ.get(
        "ENCACHE_EXPECT_MOONCAKE_ROUTE", "python")
    yield c
    c.close()


@pytest.fixture(scope="module")
def mooncake_module():
    if not os.environ.get("MOONCAKE_CONFIG_PATH"):
        pytest.skip("MOONCAKE_CONFIG_PATH is not set")
    return "mooncake:"


@pytest.fixture(scope="module")
def vllm_store(ns_cache):
    """vLLM's embedding Store on the same Mooncake Store and namespace, as
    the reference connector makes it (its client from MOONCAKE_CONFIG_PATH,
    its publisher's bounds)."""
    client = vllm_client.create_mooncake_embedding_store_client()
    b = vllm_backend.MooncakeEmbeddingStoreBackend(
        client, ns_cache.namespace, max_pending_items=32,
        max_pending_bytes=1 << 30)
    yield b
    b.shutdown()


def _spec(rows, cols, dtype):
    return vllm_data.TensorSpec(shape=(rows, cols), dtype=str(dtype),
                                nbytes=rows * cols * dtype.itemsize)


def _vllm_write(b, id_, t):
    """vLLM's encoder step: a miss resolved, its output saved, the write
    waited for (the publisher's thread; bounded)."""
    cache = {}
    assert b.resolve_inputs({id_: _spec(*t.shape, t.dtype)}, cache,
                            "cpu") == set()
    b.save_output(id_, t)
    key = vllm_data.make_embedding_key(b.namespace, id_)
    deadline = time.monotonic() + ectest.TIMEOUT
    while not b.store_client.exists(key):
        assert time.monotonic() < deadline, f"vLLM never wrote {key}"
        time.sleep(0.01)
    b.reap()


def _vllm_read(b, id_, rows, cols, dtype):
    cache = {}
    loaded = b.resolve_inputs({id_: _spec(rows, cols, dtype)}, cache, "cpu")
    assert loaded == {id_}, f"vLLM did not load {id_}"
    return cache[id_]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,cols", SIZES)
def test_vllm_writes_encache_reads(ns_cache, vllm_store, rows, cols, dtype):
    id_ = unique("from-vllm")
    want = ectest.sample(rows, cols, dtype, seed=rows * 3 + cols)
    _vllm_write(vllm_store, id_, want)
    r = ectest.lookup_one(ns_cache, id_, dtype, (rows, cols))
    assert r.outcome == Outcome.HIT, r.why
    assert ectest.torch_bits_equal(r.tensor, want)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,cols", SIZES)
def test_encache_writes_vllm_reads(ns_cache, vllm_store, rows, cols, dtype):
    id_ = unique("from-encache")
    want = ectest.sample(rows, cols, dtype, seed=rows * 5 + cols)
    ectest.publish_one(ns_cache, id_, want)
    got = _vllm_read(vllm_store, id_, rows, cols, dtype)
    assert ectest.torch_bits_equal(got, want)


def test_both_write_the_same_bytes(ns_cache, vllm_store):
    """The same output written by each under its own id: the two objects
    are equal byte for byte (the 24-byte header and the payload)."""
    t = ectest.sample(512, 256, F16, seed=11)
    ids = unique("same-vllm"), unique("same-encache")
    _vllm_write(vllm_store, ids[0], t)
    ectest.publish_one(ns_cache, ids[1], t)
    store = vllm_store.store_client.store
    objs = [store.get(vllm_data.make_embedding_key(ns_cache.namespace, i))
            for i in ids]
    assert len(objs[0]) == 24 + t.numel() * 2
    assert objs[0] == objs[1]
    flipped = bytearray(objs[1])
    flipped[-1] ^= 1  # one byte off is seen
    assert bytes(flipped) != objs[0]
