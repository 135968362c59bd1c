# SPDX-License-Identifier: Apache-2.0
"""Every outcome of a lookup, on real Stores: HIT, MISS, INCOMPATIBLE,
OVERSIZE, UNAVAILABLE (a redis-server the test kills), SKIPPED; and the
Step's collections."""
import re
import threading

import pytest
import torch

import encache
import ectest
from ectest import F16, F32, lookup_one, publish_one, sample
from encache import Outcome, Skip


def test_hit_from_another_cache(open_cache):
    a, b = open_cache(), open_cache()
    t = sample(4, 8)
    publish_one(a, "img-1", t)
    assert a.stats().published_written == 1
    r = lookup_one(b, "img-1", F32, (4, 8))
    assert r.outcome == Outcome.HIT and r.hit and r.id == "img-1"
    assert r.why is None and r.verdict is None and r.found is None
    assert ectest.torch_bits_equal(r.tensor, t)
    st = b.stats()
    assert (st.lookups, st.candidates, st.hits, st.misses) == (1, 1, 1, 0)
    assert st.bytes_read == t.numel() * t.element_size()


def test_miss(open_cache):
    c = open_cache()
    r = lookup_one(c, "never-published", F32, (2, 3))
    assert r.outcome == Outcome.MISS and not r.hit
    assert r.tensor is None and r.verdict is None and r.found is None
    assert "not in the Store" in r.why
    assert c.stats().misses == 1


@pytest.mark.parametrize("dtype,shape,verdict,found", [
    (F32, (8, 4), "shape", (0, 4, 8)),    # same byte count, other shape
    (F16, (4, 16), "dtype", (0, 4, 8)),   # same byte count, other dtype
    (F32, (4, 16), "length", (0, 4, 8)),  # shorter than expected
    # Longer than expected: the Store refuses it whole, no header is read
    # (the C API's found is then zeroed).
    (F32, (4, 4), "length", (0, 0, 0)),
])
def test_incompatible(open_cache, dtype, shape, verdict, found):
    a, b = open_cache(), open_cache()
    publish_one(a, "img", sample(4, 8))  # float32 (wire code 0), 4 x 8
    r = lookup_one(b, "img", dtype, shape)
    assert r.outcome == Outcome.INCOMPATIBLE and not r.hit
    assert r.tensor is None
    assert r.verdict == verdict, r.why
    assert tuple(r.found) == found
    assert verdict in r.why
    assert b.stats().incompatible == 1


@pytest.mark.parametrize("how", ["ec_transfer_config", "options"])
def test_oversize(open_cache, how):
    a = open_cache()
    t = sample(64, 64)  # 16 KiB of payload, 16408 bytes with the header
    publish_one(a, "big", t)
    limit = 4096
    if how == "options":
        kw = {"options": {"cross_encoder_cache": True,
                          "store_read_buffer_bytes": limit}}
    else:
        kw = {"ec_transfer_config": ectest.config(
            store_read_buffer_bytes=limit)}
    logs = []
    b = open_cache(log=lambda m: logs.append((m, threading.get_ident())), **kw)
    r = lookup_one(b, "big", F32, (64, 64))
    assert r.outcome == Outcome.OVERSIZE and r.tensor is None
    assert "store_read_buffer_bytes" in r.why and str(limit) in r.why, r.why
    assert b.stats().oversize == 1
    # The library's warning comes to the log callable, on this thread.
    assert logs, "no warning was logged for the oversize object"
    assert all(tid == threading.get_ident() for _, tid in logs)


def test_unavailable_when_the_server_dies(open_cache, tmp_path):
    server = ectest.RedisServer(tmp_path)
    try:
        url = server.url + "?connect_timeout_ms=500&timeout_ms=1000"
        c = open_cache(url, model=ectest.unique("model"))
        assert lookup_one(c, "a", F32, (2, 2)).outcome == Outcome.MISS
    finally:
        server.kill()
    with c.lookup([("a", F32, (2, 2)), ("b", F32, (2, 2))]) as step:
        for r in step:
            assert r.outcome == Outcome.UNAVAILABLE and not r.hit, r.outcome
            assert r.tensor is None and r.why, r.why
        # A publication while the Store is down is queued; its write
        # fails recoverably, and flush says nothing.
        assert step.publish("b", sample(2, 2)) == Skip.QUEUED
    c.flush()
    st = c.stats()
    assert st.unavailable == 2 and st.published_failed == 1
    assert not st.poisoned


@pytest.mark.parametrize("device", ["cuda:7", torch.device("cuda", 9)],
                         ids=str)
def test_skipped_device(open_cache, device):
    """A CUDA device that does not exist (the fake runtime has 2; without
    a runtime every CUDA item is SKIPPED: test_cuda.py)."""
    c = open_cache()
    with c.lookup([encache.Item(id="gpu", dtype=F32, shape=(2, 2),
                                device=device)]) as step:
        r = step.results[0]
        assert r.outcome == Outcome.SKIPPED and r.tensor is None
        assert re.search("cuda|device|host", r.why, re.I), r.why
        # A skipped item is not a candidate: nothing to publish.
        assert step.publish("gpu", sample(2, 2)) == Skip.NOT_CANDIDATE
    assert c.stats().skipped == 1


def test_skipped_empty_matrix(open_cache):
    r = lookup_one(open_cache(), "empty", F32, (0, 8))
    assert r.outcome == Outcome.SKIPPED and "0" in r.why, r.why


def test_disabled_cache_skips(open_cache):
    c = open_cache(ec_transfer_config={"ec_connector_extra_config": {}})
    assert not c.enabled
    with c.lookup([("x", F32, (2, 2))]) as step:
        r = step.results[0]
        assert r.outcome == Outcome.SKIPPED and "cross_encoder_cache" in r.why
        assert step.publish("x", sample(2, 2)) == Skip.DISABLED


def test_step_collections(open_cache):
    a, b = open_cache(), open_cache()
    assert a.enabled and a.namespace == b.namespace
    assert a.namespace.endswith("@protocol:v3") and "model:org/vit" in a.namespace
    t = sample(2, 3)
    publish_one(a, "h", t)
    with b.step() as step:
        assert list(step) == [] and step.results == []
        step.lookup([("h", F32, (2, 3)), ("m", "float32", (2, 3))])
        step.lookup([encache.Item(id="m2", dtype=F32, shape=(2, 3))])
        assert [r.id for r in step] == ["h", "m", "m2"]
        assert list(step.hits) == ["h"]
        assert ectest.torch_bits_equal(step.hits["h"], t)
        assert [r.id for r in step.misses] == ["m", "m2"]
        # Both lookups made candidates of the step.
        assert step.publish("m", sample(2, 3, seed=1)) == Skip.QUEUED
        assert step.publish("m2", sample(2, 3, seed=2)) == Skip.QUEUED
    b.flush()
    assert b.stats().published_written == 2


def test_results_outlive_their_step(open_cache):
    a, b = open_cache(), open_cache()
    t = sample(3, 3)
    publish_one(a, "h", t)
    step = b.lookup([("h", F32, (3, 3)), ("m", F32, (3, 3))])
    hit, miss = step.results
    step.close()
    step.close()  # idempotent
    del step
    assert hit.hit and ectest.torch_bits_equal(hit.tensor, t)
    assert miss.outcome == Outcome.MISS and "not in the Store" in miss.why
    assert b.stats().steps_open == 0
