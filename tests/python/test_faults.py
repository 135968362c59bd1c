# SPDX-License-Identifier: Apache-2.0
"""Store faults through the fault Store (tests/python/fault_store.c): an
unconfirmed read or write poisons the Cache, which then raises
PoisonedError on every call, close included; a recoverable failure is an
outcome, never an exception."""
import pytest

import encache
import ectest
from ectest import F32, lookup_one, publish_one, sample
from encache import Outcome


def _assert_poisoned(c):
    """Every later call raises PoisonedError; close reports it once."""
    assert c.stats().poisoned
    with pytest.raises(encache.PoisonedError):
        c.lookup([("later", F32, (2, 2))])
    with pytest.raises(encache.PoisonedError):
        c.step()
    with pytest.raises(encache.PoisonedError):
        c.flush()
    with pytest.raises(encache.PoisonedError) as e:
        c.close()
    assert e.value.name == "EPOISONED" and e.value.code == -30609
    c.close()  # closed now: idempotent
    with pytest.raises(encache.ClosedError):
        c.lookup([("later", F32, (2, 2))])


def test_unconfirmed_read_poisons(open_cache, shm, fault):
    url = shm(scheme="pyfault")
    c = open_cache(url)
    publish_one(c, "p", sample(4, 4))
    fault.answer(fault.READS, fault.UNCONFIRMED)
    with pytest.raises(encache.PoisonedError) as e:
        c.lookup([("p", F32, (4, 4))])
    assert isinstance(e.value, encache.Error) and e.value.name == "EPOISONED"
    assert fault.calls(fault.READS) == 1
    fault.reset()  # the Store is fine again: the Cache stays poisoned
    _assert_poisoned(c)
    # Other Caches on the same Store are not affected.
    r = lookup_one(open_cache(ectest.shm_of(url)), "p", F32, (4, 4))
    assert r.hit


def test_unconfirmed_write_poisons(open_cache, shm, fault):
    c = open_cache(shm(scheme="pyfault"))
    fault.answer(fault.WRITES, fault.UNCONFIRMED)
    publish_one(c, "w", sample(4, 4), flush=False)
    assert fault.wait_finished(fault.WRITES)
    with pytest.raises(encache.PoisonedError):
        c.flush()
    _assert_poisoned(c)


def test_step_of_a_poisoned_cache(open_cache, shm, fault):
    c = open_cache(shm(scheme="pyfault"))
    publish_one(c, "p", sample(2, 2))
    step = c.lookup([("q", F32, (2, 2))])
    fault.answer(fault.READS, fault.UNCONFIRMED)
    with pytest.raises(encache.PoisonedError):
        c.lookup([("p", F32, (2, 2))])
    with pytest.raises(encache.PoisonedError):
        step.publish("q", sample(2, 2))
    with pytest.raises(encache.PoisonedError):
        step.lookup([("p", F32, (2, 2))])


def test_unavailable_read_is_an_outcome(open_cache, shm, fault):
    c = open_cache(shm(scheme="pyfault"))
    publish_one(c, "p", sample(2, 2))
    fault.answer(fault.READS, fault.UNAVAILABLE)
    r = lookup_one(c, "p", F32, (2, 2))
    assert r.outcome == Outcome.UNAVAILABLE and "pyfault" in r.why, r.why
    fault.reset()
    assert lookup_one(c, "p", F32, (2, 2)).hit
    assert not c.stats().poisoned
