# SPDX-License-Identifier: Apache-2.0
"""Lookups that do not wait (docs/python.md, "lookup and Step"): a lookup
started with wait=False gives the blocking lookup's Results for the same
Store state (shm and a real Redis), stays pending while the fault Store
holds its read (wait(0) is False, the GIL is free meanwhile), completes
in an event loop that keeps running other coroutines, is given up safely
when its step or Cache is closed or collected (its hit memory released),
and raises the blocking lookup's errors from wait()."""
import asyncio
import gc
import os
import random
import threading
import time

import pytest
import torch

import encache
import ectest
from ectest import BF16, F16, F32, TIMEOUT, publish_one, sample
from encache import Outcome

REDIS = os.environ.get("ENCACHE_REDIS_URL")
SANITIZED = "libasan" in os.environ.get("LD_PRELOAD", "")


def _published(cache, rng, n=12):
    """Publishes n objects of assorted shapes and dtypes (each id's own);
    returns {id: tensor}."""
    out = {}
    for i in range(n):
        shape = (rng.randint(1, 9), rng.randint(1, 33))
        t = sample(*shape, dtype=rng.choice((F32, F16, BF16)), seed=i)
        with cache.step() as step:
            step.lookup([(f"p{i}", t.dtype, shape)])
            assert step.publish(f"p{i}", t) == encache.Skip.QUEUED
        out[f"p{i}"] = t
    cache.flush()
    return out


def _candidates(rng, present):
    """A random candidate set: hits, misses, INCOMPATIBLE ones (another
    shape or dtype than the object's) and duplicates."""
    items = []
    for _ in range(rng.randint(0, 10)):
        kind = rng.random()
        if kind < 0.4:
            i = rng.choice(sorted(present))
            t = present[i]
            items.append((i, t.dtype, tuple(t.shape)))
        elif kind < 0.6:
            items.append((f"absent{rng.randint(0, 5)}", F32, (2, 3)))
        elif kind < 0.7:
            i = rng.choice(sorted(present))
            t = present[i]
            items.append((i, t.dtype, (t.shape[0] + 1, t.shape[1])))
        elif kind < 0.8:
            i = rng.choice(sorted(present))
            t = present[i]
            other = F16 if t.dtype != F16 else F32
            items.append((i, other, tuple(t.shape)))
        elif items:
            items.append(rng.choice(items))  # a duplicate
    return items


def _summary(results):
    """What a Result says, with its tensor's raw bits."""
    out = []
    for r in results:
        bits = None
        if r.tensor is not None:
            bits = (r.tensor.dtype, tuple(r.tensor.shape),
                    ectest.raw(r.tensor).tobytes())
        out.append((r.id, r.outcome, r.why, r.verdict, r.found, bits))
    return out


def _same_as_blocking(cache, present, rng, sets):
    seen = set()
    for _ in range(sets):
        items = _candidates(rng, present)
        with cache.lookup(items) as step:
            blocking = _summary(step.results)
        step = cache.lookup(items, wait=False)
        assert isinstance(step, encache.Step)
        assert step.wait() is True
        started = _summary(step.results)
        step.close()
        assert started == blocking, items
        seen.update(o for _, o, *_ in blocking)
        # Step.lookup(wait=False) too, on a step of its own.
        with cache.step() as step:
            assert step.lookup(items, wait=False) is step
            assert step.wait(timeout=TIMEOUT)
            assert _summary(step.results) == blocking
    return seen


def test_same_results_as_blocking_shm(open_cache):
    rng = random.Random(29)
    c = open_cache()
    present = _published(c, rng)
    seen = _same_as_blocking(c, present, rng, 60)
    assert {Outcome.HIT, Outcome.MISS, Outcome.INCOMPATIBLE} <= seen


def test_same_results_as_blocking_redis(open_cache):
    if not REDIS:
        pytest.skip("ENCACHE_REDIS_URL is not set: run the suite with "
                    "tests/python/run.sh, which starts a redis-server")
    rng = random.Random(30)
    c = open_cache(REDIS, model=ectest.unique("model"))
    present = _published(c, rng)
    seen = _same_as_blocking(c, present, rng, 40)
    assert {Outcome.HIT, Outcome.MISS, Outcome.INCOMPATIBLE} <= seen


def _held(open_cache, shm, fault, rows=64, cols=64):
    """A Cache on the fault Store holding a published "h" (returned), with
    reads held from now on."""
    c = open_cache(shm(scheme="pyfault"))
    t = sample(rows, cols)
    publish_one(c, "h", t)
    fault.hold(fault.READS)
    return c, t


def test_wait_zero_on_a_held_read(open_cache, shm, fault):
    c, t = _held(open_cache, shm, fault)
    t0 = time.monotonic()
    step = c.lookup([("h", F32, (64, 64)), ("m", F32, (2, 2))], wait=False)
    assert time.monotonic() - t0 < 5  # returned without the read
    assert fault.wait_held(fault.READS)
    assert step.wait(0) is False
    assert step.done is False
    t0 = time.monotonic()
    assert step.wait(timeout=0.2) is False  # a bounded wait, still pending
    assert time.monotonic() - t0 >= 0.19
    fd = step.fileno()
    assert fd >= 0 and step.fileno() == fd
    fault.hold(fault.READS, False)
    deadline = time.monotonic() + TIMEOUT
    while not step.done:  # a poll that collects nothing
        assert time.monotonic() < deadline
        time.sleep(0.001)
    assert step.done is True  # still: done consumed nothing
    assert step.wait(0) is True  # complete: collected by a poll
    assert step.done is True
    assert fault.timed_out(fault.READS) == 0
    hit, miss = step.results
    assert hit.hit and ectest.torch_bits_equal(hit.tensor, t)
    assert miss.outcome == Outcome.MISS
    assert step.wait(0) is True  # nothing pending any more
    step.close()


def test_results_wait_implicitly_and_a_second_lookup_is_refused(
        open_cache, shm, fault):
    c, t = _held(open_cache, shm, fault)
    step = c.lookup([("h", F32, (64, 64))], wait=False)
    assert fault.wait_held(fault.READS)
    with pytest.raises(encache.InvalidError, match="pending"):
        step.lookup([("x", F32, (2, 2))])
    with pytest.raises(encache.InvalidError, match="pending"):
        step.lookup([("x", F32, (2, 2))], wait=False)
    release = threading.Timer(0.2, fault.hold, (fault.READS, False))
    release.start()
    results = step.results  # waits for the lookup
    release.join(TIMEOUT)
    assert len(results) == 1 and results[0].hit
    assert ectest.torch_bits_equal(step.hits["h"], t)
    assert step.misses == [] and len(step) == 1
    # Once collected, the step looks up again.
    assert step.lookup([("x", F32, (2, 2))])[0].outcome == Outcome.MISS
    step.close()


def test_publish_waits_for_the_pending_lookup(open_cache):
    c = open_cache()
    step = c.lookup([("new", F32, (4, 4))], wait=False)
    # The lookup makes "new" a candidate of the step: publish waits for it
    # (else the publication would be NOT_CANDIDATE).
    assert step.publish("new", sample(4, 4)) == encache.Skip.QUEUED
    assert step.results[0].outcome == Outcome.MISS
    step.close()
    c.flush()
    assert ectest.lookup_one(c, "new", F32, (4, 4)).hit


def test_bad_arguments(open_cache):
    c = open_cache()
    with pytest.raises(encache.InvalidError, match="item 0"):
        c.lookup([("a", F32, (2,))], wait=False)
    with pytest.raises(TypeError):
        c.lookup([], hurry=True)
    step = c.step()
    with pytest.raises(encache.InvalidError, match="timeout"):
        step.wait(-1)
    assert step.wait() is True and step.done  # nothing was started
    assert step.lookup([], wait=False) is step and step.wait(TIMEOUT)
    assert step.results == []
    step.close()
    with pytest.raises(encache.ClosedError):
        step.fileno()
    with pytest.raises(encache.ClosedError):
        step.lookup([], wait=False)
    with pytest.raises(TypeError):
        encache.Step()


def test_gil_released_during_wait(open_cache, shm, fault):
    c, t = _held(open_cache, shm, fault)
    step = c.lookup([("h", F32, (64, 64))], wait=False)
    assert fault.wait_held(fault.READS)
    progress = []

    def run():
        time.sleep(0.1)
        progress.append(sum(range(1000)))  # bytecode: needs the GIL
        fault.hold(fault.READS, False)

    th = threading.Thread(target=run, daemon=True)
    th.start()
    assert step.wait() is True  # without a bound: released by `th`
    th.join(TIMEOUT)
    assert progress, "the other thread made no progress"
    assert fault.timed_out(fault.READS) == 0, \
        "the read was released by its bound: the GIL was held in wait()"
    assert step.results[0].hit
    step.close()


def test_two_lookups_read_at_once_and_the_cache_stays_usable(
        open_cache, shm, fault):
    """With store_reads_in_flight 2, two steps' started lookups read the
    Store at the same time (both reads held at once), and meanwhile the
    Cache takes other calls: a step opened, another step's publish."""
    c = open_cache(shm(scheme="pyfault"),
                   ec_transfer_config=ectest.config(store_reads_in_flight=2))
    t, u = sample(64, 64), sample(8, 8, seed=3)
    publish_one(c, "h", t)
    publish_one(c, "g", u)
    other = c.step()
    assert other.lookup([("fresh", F32, (4, 4))])[0].outcome == Outcome.MISS
    fault.hold(fault.READS)
    a = c.lookup([("h", F32, (64, 64))], wait=False)
    b = c.lookup([("g", F32, (8, 8)), ("nope", F32, (8, 8))], wait=False)
    assert fault.wait_held(fault.READS, 2)  # both in the Store at once
    t0 = time.monotonic()
    extra = c.step()
    assert other.publish("fresh", sample(4, 4, seed=9)) == encache.Skip.QUEUED
    assert time.monotonic() - t0 < 5  # neither waited for the reads
    assert not a.done and not b.done
    extra.close()
    fault.hold(fault.READS, False)
    assert b.wait(TIMEOUT) and a.wait(TIMEOUT)
    assert ectest.torch_bits_equal(a.results[0].tensor, t)
    g, nope = b.results
    assert g.hit and ectest.torch_bits_equal(g.tensor, u)
    assert nope.outcome == Outcome.MISS
    c.flush()
    assert ectest.lookup_one(c, "fresh", F32, (4, 4)).hit
    for s in (a, b, other):
        s.close()


def test_asyncio_two_steps_and_a_running_loop(open_cache, shm, fault):
    c, t = _held(open_cache, shm, fault)
    publish_one(c, "g", sample(8, 8, seed=5))
    fault.hold(fault.READS)  # publish_one's lookup had them released

    async def main():
        ticks = []
        # Steps are opened first: opening one may wait for a running
        # lookup of the Cache (its turn, outside its Store calls), a start
        # does not.
        a, b = c.step(), c.step()
        assert a.lookup([("h", F32, (64, 64))], wait=False) is a
        assert b.lookup([("g", F32, (8, 8)), ("nope", F32, (8, 8))],
                        wait=False) is b

        async def ticker():
            while len(ticks) < 20:
                ticks.append(time.monotonic())
                await asyncio.sleep(0.005)
            # The reads are still held: both lookups are pending, and the
            # loop ran this coroutine all along.
            assert not a.done and not b.done
            fault.hold(fault.READS, False)

        done_a, done_b, _ = await asyncio.wait_for(
            asyncio.gather(a, b.wait_async(), ticker()), TIMEOUT)
        return a, b, done_a, done_b, ticks

    a, b, done_a, done_b, ticks = asyncio.run(main())
    assert done_a is a and done_b is b
    assert len(ticks) == 20
    assert a.results[0].hit and ectest.torch_bits_equal(a.results[0].tensor, t)
    g, nope = b.results
    assert g.hit and nope.outcome == Outcome.MISS
    assert fault.timed_out(fault.READS) == 0
    a.close()
    b.close()


def test_awaiting_a_complete_step(open_cache):
    c = open_cache()
    publish_one(c, "k", sample(4, 4))

    async def main():
        step = c.lookup([("k", F32, (4, 4))], wait=False)
        await step
        await step  # nothing pending: returns at once
        return step

    step = asyncio.run(main())
    assert [r.outcome for r in step] == [Outcome.HIT]
    step.close()


def test_cancelled_await_leaves_no_reader(open_cache, shm, fault):
    c, t = _held(open_cache, shm, fault)
    step = c.lookup([("h", F32, (64, 64))], wait=False)

    async def main():
        task = asyncio.ensure_future(step.wait_async())
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        loop = asyncio.get_running_loop()
        # No reader is left on the step's descriptor.
        return loop.remove_reader(step.fileno())

    assert asyncio.run(main()) is False
    fault.hold(fault.READS, False)
    assert step.wait(TIMEOUT) and step.results[0].hit
    step.close()


def test_close_with_a_running_lookup(open_cache, shm, fault):
    c, t = _held(open_cache, shm, fault)
    step = c.lookup([("h", F32, (64, 64))], wait=False)
    assert fault.wait_held(fault.READS)
    release = threading.Timer(0.2, fault.hold, (fault.READS, False))
    release.start()
    step.close()  # waits for the running lookup, the GIL released
    release.join(TIMEOUT)
    assert step.closed and fault.timed_out(fault.READS) == 0
    assert step.results == []  # given up: nothing collected
    with pytest.raises(encache.ClosedError):
        step.wait()
    st = c.stats()
    assert st.steps_open == 0 and st.hits == 1
    assert ectest.lookup_one(c, "h", F32, (64, 64)).hit  # still healthy


def test_close_with_a_queued_lookup(open_cache, shm, fault):
    c, t = _held(open_cache, shm, fault)
    # Opened first: opening a step waits for the running lookup (the
    # Cache's turn); starting one does not.
    queued = c.step()
    running = c.lookup([("h", F32, (64, 64))], wait=False)
    assert fault.wait_held(fault.READS)
    assert queued.lookup([("h", F32, (64, 64))], wait=False) is queued
    assert not queued.done
    release = threading.Timer(0.2, fault.hold, (fault.READS, False))
    release.start()
    queued.close()  # waits for the running one; its own may never run
    release.join(TIMEOUT)
    assert fault.timed_out(fault.READS) == 0
    assert queued.closed and queued.results == []
    assert running.wait(TIMEOUT) and running.results[0].hit
    running.close()
    st = c.stats()
    assert st.steps_open == 0 and st.hits in (1, 2)


def test_cache_close_with_a_pending_lookup(open_cache, shm, fault):
    c, t = _held(open_cache, shm, fault)
    step = c.lookup([("h", F32, (64, 64))], wait=False)
    assert fault.wait_held(fault.READS)
    release = threading.Timer(0.2, fault.hold, (fault.READS, False))
    release.start()
    c.close()  # waits for the running lookup, the GIL released
    release.join(TIMEOUT)
    assert c.closed and fault.timed_out(fault.READS) == 0
    with pytest.raises(encache.ClosedError):
        step.wait()
    with pytest.raises(encache.ClosedError):
        step.results
    step.close()
    assert step.closed


def test_collected_with_a_pending_lookup(open_cache, shm, fault):
    c, t = _held(open_cache, shm, fault)
    step = c.lookup([("h", F32, (64, 64))], wait=False)
    assert fault.wait_held(fault.READS)
    threading.Timer(0.2, fault.hold, (fault.READS, False)).start()
    del step
    gc.collect()
    assert c.stats().steps_open == 0
    assert ectest.lookup_one(c, "h", F32, (64, 64)).hit


def test_poisoned_read_raises_from_wait(open_cache, shm, fault):
    c = open_cache(shm(scheme="pyfault"))
    publish_one(c, "p", sample(4, 4))
    fault.answer(fault.READS, fault.UNCONFIRMED)
    step = c.lookup([("p", F32, (4, 4))], wait=False)
    with pytest.raises(encache.PoisonedError) as e:
        step.wait()
    assert e.value.name == "EPOISONED"
    assert step.wait(0) is True and step.results == []  # done with
    assert c.stats().poisoned
    with pytest.raises(encache.PoisonedError):  # refused at the start
        c.lookup([("p", F32, (4, 4))], wait=False)


def test_unavailable_read_is_an_outcome(open_cache, shm, fault):
    c = open_cache(shm(scheme="pyfault"))
    publish_one(c, "u", sample(4, 4))
    fault.answer(fault.READS, fault.UNAVAILABLE)
    step = c.lookup([("u", F32, (4, 4))], wait=False)
    assert step.wait(TIMEOUT)
    assert step.results[0].outcome == Outcome.UNAVAILABLE
    assert step.results[0].why
    step.close()


def test_given_up_hits_are_released(open_cache):
    """Hits of lookups given up (closed pending, closed complete but not
    collected, collected by the GC) and collected ones are all released:
    1500 of each kind of 64 KiB hits, and the resident memory stays within
    a few of them (a leak would keep 4 x 1500 x 64 KiB)."""
    c = open_cache(options={"cross_encoder_cache": True,
                            "store_max_pending_bytes": 1 << 24})
    t = sample(128, 128)  # 64 KiB
    publish_one(c, "big", t)
    item = [("big", F32, (128, 128))]

    def rounds(n):
        for i in range(n):
            a = c.lookup(item, wait=False)
            a.close()  # pending (or complete): given up
            b = c.lookup(item, wait=False)
            assert b.wait(TIMEOUT)
            b.close()
            d = c.lookup(item, wait=False)
            del d  # freed while pending
            e = c.lookup(item, wait=False)
            assert e.results[0].hit  # collected implicitly
            e.close()
            del e

    rounds(200)  # warm-up: the block cache, arenas
    gc.collect()
    rss0 = _anon_rss()
    rounds(1500)
    gc.collect()
    growth = _anon_rss() - rss0
    # AddressSanitizer's quarantine keeps freed memory resident.
    assert SANITIZED or growth < 16 << 20, growth
    assert c.stats().steps_open == 0


def _anon_rss():
    with open("/proc/self/statm") as f:
        fields = f.read().split()
    return (int(fields[1]) - int(fields[2])) * os.sysconf("SC_PAGE_SIZE")


def test_log_callable_on_the_lookup_thread_may_not_call_the_cache(
        open_cache):
    """The warning of a started lookup (an OVERSIZE object) is logged on
    the library's lookup thread, which holds the Cache's turn meanwhile:
    the log callable's call into the Cache is refused (InvalidError),
    never a deadlock."""
    a = open_cache()
    publish_one(a, "big", sample(64, 64))  # 16 KiB
    answers = []

    def log(message):
        try:
            b.stats()
            answers.append("no error")
        except encache.InvalidError:
            answers.append(("InvalidError", threading.get_ident()))

    b = open_cache(options={"cross_encoder_cache": True,
                            "store_read_buffer_bytes": 4096}, log=log)
    step = b.lookup([("big", F32, (64, 64))], wait=False)
    assert step.wait(TIMEOUT)
    assert step.results[0].outcome == Outcome.OVERSIZE
    step.close()
    assert answers and "no error" not in answers, answers
    # ... on another thread than this one (which is free to call).
    assert all(tid != threading.get_ident() for _, tid in answers)
    assert b.stats().oversize == 1


def _value(k):
    return torch.arange(32, dtype=F32).reshape(4, 8) + 100 * k


def test_threads_share_a_cache_with_started_lookups(open_cache):
    """Four threads start lookups on one Cache and collect them every way
    (wait, a poll loop, implicitly, closing or dropping them pending),
    publishing their misses, while a fifth flushes: every hit holds the
    value published for its id."""
    c = open_cache()
    errors, hits = [], []
    barrier = threading.Barrier(5)

    def worker(tid):
        rng = random.Random(tid)
        try:
            barrier.wait(TIMEOUT)
            for j in range(150):
                ids = sorted({rng.randrange(24) for _ in range(3)})
                step = c.lookup([(f"k{k}", F32, (4, 8)) for k in ids],
                                wait=False)
                how = j % 5
                if how == 3:
                    step.close()
                    continue
                if how == 4:
                    del step
                    continue
                if how == 0:
                    assert step.wait(TIMEOUT)
                elif how == 1:
                    while not step.wait(0):
                        time.sleep(0.0005)
                for k, r in zip(ids, step.results):  # how 2: implicitly
                    if r.hit:
                        assert torch.equal(r.tensor, _value(k)), k
                        hits.append(k)
                    else:
                        step.publish(r.id, _value(k))
                step.close()
        except Exception as e:  # re-raised on the main thread
            errors.append(e)

    def flusher():
        barrier.wait(TIMEOUT)
        for _ in range(50):
            c.flush()
            time.sleep(0.002)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    threads.append(threading.Thread(target=flusher))
    for th in threads:
        th.start()
    for th in threads:
        th.join(TIMEOUT)
    assert not errors, errors
    assert hits, "no hit at all"
    gc.collect()
    assert c.stats().steps_open == 0


def test_step_dropped_on_the_lookup_thread(open_cache):
    """A log callable on the lookup thread that drops the last reference
    to another step of its Cache: that step is left to the Cache's close
    (closing it there would wait for the lookup that is running it)."""
    a = open_cache()
    publish_one(a, "big", sample(64, 64))
    held, dropped = [], []

    def log(message):
        if held:
            dropped.append(threading.get_ident())
            held.clear()  # the other step's last reference

    b = open_cache(options={"cross_encoder_cache": True,
                            "store_read_buffer_bytes": 4096}, log=log)
    held.append(b.step())
    step = b.lookup([("big", F32, (64, 64))], wait=False)
    assert step.wait(TIMEOUT)
    assert step.results[0].outcome == Outcome.OVERSIZE
    assert dropped and dropped[0] != threading.get_ident()
    step.close()
    assert b.stats().steps_open == 1  # the dropped one, until the close
    b.close()


def test_cache_dropped_on_the_lookup_thread(open_cache, store):
    """A log callable on the lookup thread that drops the last references
    to its Cache and to the step being looked up: both are left alive and
    open (their close would wait for that very lookup), nothing crashes,
    and the Store is fine for others."""
    a = open_cache()
    publish_one(a, "big", sample(64, 64))
    box, logged, dropped = {}, threading.Event(), threading.Event()

    def log(message):
        assert dropped.wait(TIMEOUT)  # the test's own references are gone
        box.clear()  # the last references to the Cache and the step
        logged.set()

    c = ectest.open_cache(store, options={"cross_encoder_cache": True,
                                          "store_read_buffer_bytes": 4096},
                          log=log)
    box["cache"] = c
    box["step"] = c.lookup([("big", F32, (64, 64))], wait=False)
    del c
    dropped.set()
    assert logged.wait(TIMEOUT)
    time.sleep(0.1)  # the lookup finishes, into what was left alive
    gc.collect()
    assert box == {}
    assert ectest.lookup_one(a, "big", F32, (64, 64)).hit


def test_one_coroutine_awaits_a_step_at_a_time(open_cache, shm, fault):
    c, t = _held(open_cache, shm, fault)
    step = c.lookup([("h", F32, (64, 64))], wait=False)

    async def main():
        first = asyncio.ensure_future(step.wait_async())
        await asyncio.sleep(0.02)
        with pytest.raises(encache.InvalidError, match="one at a time"):
            await step
        fault.hold(fault.READS, False)
        return await asyncio.wait_for(first, TIMEOUT)

    assert asyncio.run(main()) is step
    assert step.results[0].hit
    step.close()


# A step's close() from another thread while its wait() runs (a shutdown
# path, a timeout handler): the lookup has one owner, never freed twice.
# Run in a child process: before the fix this crashed the interpreter
# (a use-after-free in the close) in most runs.
CLOSE_DURING_WAIT = r"""
import sys, threading, time
sys.path.insert(0, sys.argv[1])
import ectest, encache
from ectest import F32
f = ectest.fault()
c = ectest.open_cache(sys.argv[2])
ectest.publish_one(c, "h", ectest.sample(64, 64))
outcomes = {"hit": 0, "closed": 0}
for i in range(int(sys.argv[3])):
    f.reset()
    f.hold(f.READS)
    step = c.lookup([("h", F32, (64, 64))], wait=False)
    assert f.wait_held(f.READS)

    def waiter():
        try:
            assert step.wait(ectest.TIMEOUT)
            outcomes["hit"] += step.results[0].hit
        except encache.ClosedError:
            outcomes["closed"] += 1

    w = threading.Thread(target=waiter)
    w.start()
    time.sleep(0.001 * (i % 4))
    closer = threading.Thread(target=step.close)
    closer.start()
    time.sleep(0.001 * (i % 3))
    f.hold(f.READS, False)
    closer.join(ectest.TIMEOUT)
    w.join(ectest.TIMEOUT)
    assert not closer.is_alive() and not w.is_alive() and step.closed
st = c.stats()
assert st.steps_open == 0, st.steps_open
assert ectest.lookup_one(c, "h", F32, (64, 64)).hit
c.close()
print(outcomes["hit"], outcomes["closed"])
"""


def test_close_on_another_thread_during_wait(shm, fault):
    import subprocess
    import sys
    out = subprocess.run(
        [sys.executable, "-c", CLOSE_DURING_WAIT, os.path.dirname(__file__),
         shm(scheme="pyfault"), "60"],
        capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, (out.returncode, out.stderr[-3000:])
    hits, closed = map(int, out.stdout.split())
    assert hits + closed == 60
