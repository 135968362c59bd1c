# SPDX-License-Identifier: Apache-2.0
"""The round trip on a real Redis (tests/python/run.sh starts one, and a
Redis Cluster, with scripts/redis-servers.sh): MISS, publish, HIT bit for
bit from another Cache, INCOMPATIBLE.  Each test has a model of its own,
so that its keys are new."""
import os

import pytest

import ectest
from ectest import DTYPES, F32, lookup_one, publish_one, sample
from encache import Outcome

URLS = [os.environ.get(v) for v in ("ENCACHE_REDIS_URL",
                                    "ENCACHE_REDIS_CLUSTER_URL")]


def _url(i):
    if not URLS[i]:
        pytest.skip("ENCACHE_REDIS_URL / ENCACHE_REDIS_CLUSTER_URL are not "
                    "set: run the suite with tests/python/run.sh, which "
                    "starts redis-servers")
    return URLS[i]


@pytest.mark.parametrize("server", [0, 1], ids=["redis", "redis-cluster"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_round_trip(open_cache, server, dtype):
    url, model = _url(server), ectest.unique("model")
    a = open_cache(url, model=model, dtype=dtype)
    b = open_cache(url, model=model, dtype=dtype, output="numpy")
    t = sample(16, 24, dtype)
    assert lookup_one(b, "img", dtype, (16, 24)).outcome == Outcome.MISS
    publish_one(a, "img", t)
    assert a.stats().published_written == 1
    r = lookup_one(b, "img", dtype, (16, 24))
    assert r.hit and ectest.same_bits(r.tensor, t)
    assert r.tensor.ctypes.data == r.address
    r = lookup_one(b, "img", dtype, (24, 16))
    assert r.outcome == Outcome.INCOMPATIBLE and r.verdict == "shape"


def test_many_items_in_one_lookup(open_cache):
    url, model = _url(0), ectest.unique("model")
    a, b = open_cache(url, model=model), open_cache(url, model=model)
    ts = {f"i{k}": sample(8, 8, seed=k) for k in range(0, 40, 2)}
    with a.lookup([(k, F32, (8, 8)) for k in ts]) as step:
        for k, t in ts.items():
            step.publish(k, t)
    a.flush()
    with b.lookup([(f"i{k}", F32, (8, 8)) for k in range(40)]) as step:
        for r in step:
            assert r.hit == (r.id in ts), (r.id, r.outcome, r.why)
        assert all(ectest.torch_bits_equal(step.hits[k], t)
                   for k, t in ts.items())


def test_hits_without_a_check_are_counted(open_cache):
    """An object written without a check (checksum=off), read under
    checksum=on, is served and counted in stats().hits_unchecked; one
    written with its check is not."""
    url, model = _url(0), ectest.unique("model")
    sep = "&" if "?" in url else "?"
    bare = open_cache(url + sep + "checksum=off", model=model)
    checked = open_cache(url, model=model)
    reader = open_cache(url + sep + "checksum=on", model=model)
    publish_one(bare, "bare", sample(4, 4))
    publish_one(checked, "checked", sample(4, 4, seed=1))
    assert lookup_one(reader, "checked", F32, (4, 4)).hit
    assert reader.stats().hits_unchecked == 0
    assert lookup_one(reader, "bare", F32, (4, 4)).hit
    assert reader.stats().hits_unchecked == 1
