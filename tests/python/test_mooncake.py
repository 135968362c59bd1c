# SPDX-License-Identifier: Apache-2.0
"""Mooncake over TCP, on the stand-in client the C suite uses
(tests/fake_mooncake.c, ENCACHE_FAKE_MOONCAKE_LIB): the package's host
tensors lend the 24 bytes in front of them (encache_allocator.headroom),
so a lookup of 1 MiB or more of objects reads each one straight into its
tensor, header in front, and the tensor holds the output bit for bit."""
import ctypes
import os

import pytest

import ectest
from ectest import F32, same_bits, sample
from encache import Outcome

LIB = os.environ.get("ENCACHE_FAKE_MOONCAKE_LIB", "")
pytestmark = pytest.mark.skipif(
    not os.path.exists(LIB),
    reason="ENCACHE_FAKE_MOONCAKE_LIB names no library (run.sh sets it)")


@pytest.fixture
def mooncake_url(tmp_path, monkeypatch):
    monkeypatch.setenv("ENCACHE_MOONCAKE_LIBRARY", LIB)
    return "mooncake:" + ectest.mooncake_client_json(tmp_path)


def test_hits_are_read_straight_into_the_tensors(open_cache, mooncake_url):
    c = open_cache(mooncake_url)
    ids = [ectest.unique("mc") for _ in range(2)]
    outs = [sample(512, 512, seed=i) for i in range(2)]  # 1 MiB each
    for id_, t in zip(ids, outs):
        ectest.publish_one(c, id_, t)
    assert c.stats().published_written == 2
    # Where the stand-in's latest batch_get_into read its first keys to.
    fake = ctypes.CDLL(LIB, mode=os.RTLD_NOLOAD | os.RTLD_GLOBAL)
    bufs = (ctypes.c_void_p * 4).in_dll(fake, "fake_mooncake_get_bufs")
    with c.lookup([(i, F32, (512, 512)) for i in ids]) as step:
        for r, want in zip(step.results, outs):
            assert r.outcome == Outcome.HIT, r.why
            assert same_bits(r.tensor, want)
        got = [r.tensor.data_ptr() for r in step.results]
        assert [bufs[0], bufs[1]] == [p - 24 for p in got]
