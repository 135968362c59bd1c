# SPDX-License-Identifier: Apache-2.0
"""The binding against callers that misbehave: each test is a defect a
second read of the binding found (a crash or use-after-free under ASan, or
an exception left set), kept as a regression test."""
import gc
import threading

import numpy as np
import pytest
import torch

import ectest
from ectest import F32, encache


def test_a_cache_opens_once(store):
    c = ectest.open_cache(store)
    s = c.step()
    c.close()
    with pytest.raises(encache.InvalidError, match="opened once"):
        c.__init__(ectest.config(), model="m", dtype=F32, store=store)
    with pytest.raises(encache.ClosedError):  # not a freed step
        s.lookup([("a", F32, (1, 1))])


def test_an_option_that_is_not_utf8(store):
    with pytest.raises(encache.ConfigError) as e:
        encache.Cache(options={"cross_encoder_cache": True,
                               "ec_role": "ec_both\udcff"},
                      model="m", dtype=F32, store=store)
    assert e.value.field == "ec_role"


class ClosingArray(np.ndarray):
    """An array whose description closes the step it is published on."""
    step = None

    @property
    def __array_interface__(self):
        ClosingArray.step.close()
        return super().__array_interface__


def test_step_closed_while_publish_describes(open_cache):
    c = open_cache()
    s = c.lookup([("a", F32, (2, 2))])
    ClosingArray.step = s
    a = np.zeros((2, 2), dtype=np.float32).view(ClosingArray)
    with pytest.raises(encache.ClosedError):
        s.publish("a", a)


class MutatingDtype(str):
    """A dtype name whose hash empties the items being looked up."""
    victim = None

    def __hash__(self):
        if MutatingDtype.victim is not None:
            MutatingDtype.victim.clear()
        return str.__hash__(self)


def test_items_changed_while_parsed(open_cache):
    c = open_cache()
    items = [("a", MutatingDtype("float32"), (1, 2))] + [
        (f"id{i}", "float32", (1, 2)) for i in range(3)]
    MutatingDtype.victim = items
    try:
        step = c.lookup(items)
    finally:
        MutatingDtype.victim = None
    assert [r.id for r in step] == ["a", "id0", "id1", "id2"]


def test_close_while_another_thread_looks_up(open_cache):
    """Reasons read after a concurrent close were freed memory."""
    c = open_cache()
    ectest.publish_one(c, "x", ectest.sample(4, 8))
    stop = threading.Event()
    whys, errors = set(), []

    def lookups():
        while not stop.is_set():
            try:
                step = c.lookup([("x", F32, (8, 4)), ("y", F32, (1, 1))])
                whys.update(r.why for r in step)
            except encache.ClosedError:
                return
            except Exception as e:  # noqa: BLE001: any other is a defect
                errors.append(e)
                return

    t = threading.Thread(target=lookups)
    t.start()
    for _ in range(200):  # let some lookups run first
        if len(whys) >= 2:
            break
        threading.Event().wait(0.005)
    c.close()
    stop.set()
    t.join(ectest.TIMEOUT)
    assert not t.is_alive() and not errors
    assert whys <= {"shape 4x8 (expected 8x4)", "not in the Store"}


def test_a_step_in_a_cycle_is_closed_by_the_collector(open_cache):
    c = open_cache()
    ectest.publish_one(c, "x", ectest.sample(2, 2))
    step = c.lookup([("x", F32, (2, 2))])
    step[0].tensor.step = step  # result -> tensor -> step -> results
    assert c.stats().steps_open == 1
    del step
    gc.collect()
    assert c.stats().steps_open == 0


def test_published_memory_outlives_set(open_cache, store):
    """The storage, not the tensor, is kept: set_() cannot free it."""
    c = open_cache()
    t = ectest.sample(64, 64)
    expect = t.clone()
    with c.lookup([("x", F32, (64, 64))]) as s:
        assert s.publish("x", t) == encache.Skip.QUEUED
        t.set_(torch.empty(0).storage())  # t lets go of its memory
        gc.collect()
    c.flush()
    other = ectest.open_cache(store)
    try:
        got = ectest.lookup_one(other, "x", F32, (64, 64))
        assert got.hit and ectest.torch_bits_equal(got.tensor, expect)
    finally:
        other.close()


def test_negative_block_cache_refused():
    with pytest.raises(encache.InvalidError):
        encache.set_block_cache(-1)
    old = encache.set_block_cache(0)
    assert encache.set_block_cache(old) == 0
