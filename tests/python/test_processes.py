# SPDX-License-Identifier: Apache-2.0
"""Processes sharing one shm Store (fork and spawn): what one publishes the
other hits; a forked child opens a Cache of its own, and the parent's
raises ForkError there (and stays usable in the parent)."""
import multiprocessing

import pytest

import ectest
from ectest import F32, lookup_one, publish_one, sample
from encache import Skip


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_processes_share_a_store(open_cache, store, method):
    ctx = multiprocessing.get_context(method)
    c = open_cache()
    mine, theirs = sample(3, 5, seed=1), sample(4, 6, seed=2)
    publish_one(c, "from-parent", mine)
    msg = ectest.run_child(ctx, ectest.child_round_trip, store, "from-parent",
                           ectest.raw(mine), "from-child", theirs.numpy())
    assert msg == "ok", msg
    r = lookup_one(c, "from-child", F32, (4, 6))
    assert r.hit and ectest.torch_bits_equal(r.tensor, theirs)


def test_forked_child_and_the_parents_cache(open_cache, store):
    ctx = multiprocessing.get_context("fork")
    c = open_cache()
    publish_one(c, "p", sample(2, 2))
    step = c.lookup([("q", F32, (2, 2))])
    out = ectest.run_child(ctx, ectest.child_uses_parent, c, step, store)
    assert out == ["ForkError"] * 5 + ["hit"], out
    # In the parent, both still work.
    assert step.publish("q", sample(2, 2, seed=4)) == Skip.QUEUED
    step.close()
    c.flush()
    assert lookup_one(c, "q", F32, (2, 2)).hit
