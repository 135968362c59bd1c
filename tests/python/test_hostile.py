# SPDX-License-Identifier: Apache-2.0
"""What a careless caller does never turns into a wrong embedding (issue 26,
findings 1, 3, 4 and 9): a tensor changed or resized after publish, a NUL
inside an id or an option, an output that is not the item's, a sparse
tensor, an id too long for any key."""
import gc

import numpy as np
import pytest
import torch

import ectest
from ectest import F32, F16, lookup_one, sample
import encache
from encache import Skip


def _shrink_storage(t):
    (t.untyped_storage() if hasattr(t, "untyped_storage")
     else t.storage()).resize_(0)


MUTATIONS = {
    "resize_bigger": lambda t: t.resize_(1024, 1024),
    "resize_empty": lambda t: t.resize_(0),
    "storage_resize_0": _shrink_storage,
    "set_": lambda t: t.set_(torch.empty(0).storage()),
    "zero_": lambda t: t.zero_(),
    "fill_": lambda t: t.fill_(7.0),
}


@pytest.mark.parametrize("mutate", sorted(MUTATIONS))
@pytest.mark.parametrize("rows", [64, 1024])
def test_a_tensor_changed_after_publish_stores_the_bytes_of_the_call(
        open_cache, shm, fault, mutate, rows):
    """The write is held until the caller has changed the tensor: what is
    stored (and then served) is still the tensor's value at the call."""
    url = shm(size="64MiB", scheme="pyfault")
    c = open_cache(url)
    t = sample(rows, 256, seed=rows)
    expect = t.clone()
    fault.hold(fault.WRITES)
    with c.lookup([("x", F32, (rows, 256))]) as step:
        assert step.publish("x", t) == Skip.QUEUED
        MUTATIONS[mutate](t)
        gc.collect()
        # Memory torch freed is reused by the next allocations.
        junk = [torch.full((rows, 256), 3.0) for _ in range(4)]
    fault.hold(fault.WRITES, False)
    c.flush()
    del junk
    assert c.stats().published_written == 1
    reader = open_cache(ectest.shm_of(url))
    got = lookup_one(reader, "x", F32, (rows, 256))
    assert got.hit, (got.outcome, got.why)
    assert ectest.torch_bits_equal(got.tensor, expect), mutate


def test_a_numpy_array_resized_after_publish_stores_the_bytes_of_the_call(
        open_cache, shm, fault):
    url = shm(scheme="pyfault")
    c = open_cache(url)
    a = sample(256, 64).numpy().copy()
    expect = a.copy()
    fault.hold(fault.WRITES)
    with c.lookup([("a", F32, (256, 64))]) as step:
        assert step.publish("a", a) == Skip.QUEUED
        a.resize((4096, 64), refcheck=False)  # numpy frees the old buffer
        a[:] = 5.0
    fault.hold(fault.WRITES, False)
    c.flush()
    got = lookup_one(open_cache(ectest.shm_of(url)), "a", F32, (256, 64))
    assert got.hit and ectest.same_bits(got.tensor, expect)


def test_views_of_a_batch_publish_their_own_rows(open_cache, store):
    """Each row slice is the bytes of its call, even when the batch tensor
    is overwritten between publications."""
    c = open_cache()
    batch = sample(8, 32)
    expect = []
    items = [(f"r{i}", F32, (2, 32)) for i in range(4)]
    with c.lookup(items) as step:
        for i in range(4):
            rows = batch[2 * i:2 * i + 2]
            expect.append(rows.clone())
            assert step.publish(f"r{i}", rows) == Skip.QUEUED
            batch.fill_(float(i))  # every row changes after each call
    c.flush()
    reader = open_cache(store)
    for i in range(4):
        got = lookup_one(reader, f"r{i}", F32, (2, 32))
        assert got.hit and ectest.torch_bits_equal(got.tensor, expect[i]), i


# ------------------------------------------------------ NUL in key strings

def test_nul_in_an_id_is_refused(open_cache):
    c = open_cache()
    ectest.publish_one(c, "img-A", sample(2, 2))
    for bad in ("img-A\0other", "\0", "img-A\0"):
        with pytest.raises(encache.InvalidError, match="NUL"):
            c.lookup([(bad, F32, (2, 2))])
        with pytest.raises(encache.InvalidError, match="NUL"):
            c.lookup([encache.Item(bad, F32, (2, 2))])
    with c.lookup([("img-B", F32, (2, 2))]) as step:
        with pytest.raises(encache.InvalidError, match="NUL"):
            step.publish("img-B\0x", sample(2, 2))
    assert lookup_one(c, "img-A", F32, (2, 2)).hit  # nothing else changed


@pytest.mark.parametrize("name", ["embedding_model_identity",
                                  "embedding_cache_prefix"])
def test_nul_in_an_option_is_refused(store, name):
    with pytest.raises(encache.ConfigError, match=f"{name}.*NUL"):
        encache.Cache(model="org/vit", dtype=F32, store=store,
                      options={"cross_encoder_cache": True, name: "abc\0def"})
    # The same in the JSON (\\u0000), which Python's json reads.
    cfg = ectest.config(**{name: "abc\0def"})
    with pytest.raises(encache.ConfigError, match=f"{name}.*NUL"):
        encache.Cache(model="org/vit", dtype=F32, store=store,
                      ec_transfer_config=cfg)


@pytest.mark.parametrize("arg", ["model", "revision", "encoder_hash"])
def test_nul_in_an_argument_is_refused(store, arg):
    kw = {"model": "org/vit", arg: "abc\0def"}
    with pytest.raises(encache.InvalidError, match=f"{arg}.*NUL"):
        encache.Cache(dtype=F32, store=store,
                      ec_transfer_config=ectest.config(), **kw)


def test_nul_in_a_purge_prefix_is_refused(store):
    with pytest.raises(encache.InvalidError, match="NUL"):
        encache.purge(store, "abc\0def")


# ------------------------------------- publications checked against items

@pytest.mark.parametrize("out", [
    torch.zeros(8, 4), torch.zeros(4, 8, dtype=F16), torch.zeros(0, 8),
    torch.zeros(4, 7), torch.zeros(2, 16)])
def test_an_output_that_is_not_the_items_is_refused(open_cache, store, out):
    c = open_cache()
    with c.lookup([("x", F32, (4, 8))]) as step:
        assert step.publish("x", out) == Skip.MISMATCH
    c.flush()
    st = c.stats()
    assert st.published_written == 0
    assert st.published_skipped["MISMATCH"] == 1
    # The right output can still be written and is served.
    right = sample(4, 8)
    ectest.publish_one(c, "x", right)
    got = lookup_one(open_cache(store), "x", F32, (4, 8))
    assert got.hit and ectest.torch_bits_equal(got.tensor, right)


# --------------------------------------------------------- smaller defects

def test_a_sparse_tensor_is_the_packages_error(open_cache):
    c = open_cache()
    with c.lookup([("s", F32, (2, 2))]) as step:
        sparse = torch.eye(2).to_sparse()
        with pytest.raises(encache.InvalidError, match="sparse"):
            step.publish("s", sparse)


def test_an_id_too_long_for_a_key_is_refused_clearly(open_cache):
    c = open_cache()
    huge = "i" * (1 << 20)
    r = lookup_one(c, huge, F32, (2, 2))
    assert r.outcome == encache.Outcome.SKIPPED
    assert "id of 1048576 bytes" in r.why, r.why
    assert lookup_one(c, "short", F32, (2, 2)).outcome == encache.Outcome.MISS
