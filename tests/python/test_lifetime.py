# SPDX-License-Identifier: Apache-2.0
"""The lifetime of published memory: kept while its write may still read
it, even when the caller dropped the tensor; released at the next call
into the Cache after the write; nothing leaks over many steps."""
import gc
import os
import threading
import time
import weakref

import pytest
import torch

import ectest
from ectest import F32, lookup_one, publish_one, sample


def test_dropped_before_flush_is_written(open_cache, shm, fault):
    """A CPU tensor's bytes are copied at publish: the binding keeps no
    reference to its memory, which the caller may free at once, and the
    held write still stores the bytes of the call."""
    url = shm(scheme="pyfault")
    c = open_cache(url)
    t, fin, freed = ectest.owned_tensor(8, 8)
    expected = t.clone()
    tref = weakref.ref(t)
    fault.hold(fault.WRITES)
    publish_one(c, "dropped", t, flush=False)
    assert fault.wait_held(fault.WRITES), "the write never started"
    del t
    gc.collect()
    assert not fin.alive and tref() is None, "the caller's memory was kept"
    assert freed == [threading.get_ident()]
    assert c.stats().pending_items == 1
    fault.hold(fault.WRITES, False)
    c.flush()
    assert c.stats().pending_items == 0
    r = lookup_one(open_cache(ectest.shm_of(url)), "dropped", F32, (8, 8))
    assert r.hit and ectest.torch_bits_equal(r.tensor, expected)


def test_released_after_flush(open_cache):
    c = open_cache()
    t = sample(4, 4)
    tref = weakref.ref(t)
    publish_one(c, "x", t, flush=False)
    del t
    c.flush()
    gc.collect()
    assert tref() is None, "the published tensor is still referenced"


def test_released_after_flush_while_its_step_is_open(open_cache):
    c = open_cache()
    with c.lookup([("x", F32, (4, 4))]) as step:
        t = sample(4, 4)
        tref = weakref.ref(t)
        assert step.publish("x", t) == ectest.encache.Skip.QUEUED
        del t
        c.flush()
        gc.collect()
        assert c.stats().pending_items == 0
        assert tref() is None, "kept after its write was reaped"


def test_skipped_publication_is_released_with_its_step(open_cache):
    """A skipped publication is never retained by the library; the step
    keeps the tensor (its storage cache) until it closes."""
    c = open_cache()
    t = torch.randn(4, 6).t()
    tref = weakref.ref(t)
    with c.lookup([("x", F32, (6, 4))]) as step:
        assert step.publish("x", t) == ectest.encache.Skip.NOT_CONTIGUOUS
        del t
    gc.collect()
    assert tref() is None


def _anon_rss():
    """Resident anonymous memory in bytes, from /proc/self/statm: resident
    minus shared pages (the shm Store's pages are shared: the segment
    fills as objects are written, which is no leak)."""
    with open("/proc/self/statm") as f:
        fields = f.read().split()
    return (int(fields[1]) - int(fields[2])) * os.sysconf("SC_PAGE_SIZE")


def _steps(cache, first, n):
    """n steps: look up a new id and the one of 25 steps before, publish
    the misses, close the step; flush every 25 steps, so that the older id
    is always written (a hit), and at most 25 writes are ever pending
    (store_max_pending_items is 32: none is skipped)."""
    for i in range(first, first + n):
        with cache.lookup([(f"s{i}", F32, (4, 16)),
                           (f"s{i - 25}", F32, (4, 16))]) as step:
            new, old = step.results
            assert new.outcome == ectest.encache.Outcome.MISS
            assert step.publish(new.id, torch.full((4, 16), float(i))) \
                == ectest.encache.Skip.QUEUED
            assert i < 25 or old.tensor[0, 0].item() == i - 25
        if i % 25 == 24:
            cache.flush()


# 1 MiB over 10 000 steps is 105 bytes a step: less than any one object a
# step makes (a Step, a Result, a published or a hit tensor are each more
# than that with their 256-byte payloads), so a leak of any of them per
# step fails; the allocator's own growth after warm-up stays far below it.
LEAK_BOUND = 1 << 20
# Under AddressSanitizer (preloaded by the sanitizer build's ctest) freed
# memory waits in its quarantine, so RSS grows without a leak: only the
# Python objects are counted there.
SANITIZED = "libasan" in os.environ.get("LD_PRELOAD", "")


def test_no_leak_over_10000_steps(open_cache, figure):
    c = open_cache()
    _steps(c, 0, 1000)  # warm-up: caches, arenas, the staging buffer
    c.flush()
    gc.collect()
    rss0, objects0 = _anon_rss(), len(gc.get_objects())
    t0 = time.monotonic()
    _steps(c, 1000, 10000)
    c.flush()
    gc.collect()
    seconds = time.monotonic() - t0
    growth, objects = _anon_rss() - rss0, len(gc.get_objects()) - objects0
    figure("leak check", f"anonymous RSS {growth:+d} bytes, Python objects "
           f"{objects:+d} over 10000 steps ({seconds:.2f} s, "
           f"{seconds / 10000 * 1e6:.0f} us a step)")
    st = c.stats()
    assert (st.steps_open, st.pending_items, st.pending_bytes) == (0, 0, 0)
    # Every step publishes its new id; all but the first 25 hit the old.
    assert (st.hits, st.published_written) == (11000 - 25, 11000)
    assert SANITIZED or growth < LEAK_BOUND, growth
    assert objects < 100, objects
