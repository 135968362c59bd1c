# SPDX-License-Identifier: Apache-2.0
"""Threads: the GIL is released while the library is in a Store call (a
Store call held by the fault Store is released by Python code on another
thread: with the GIL held that thread could never run it, and the hold
would end by its 10 s bound, which the test sees); a Cache shared by four
threads gives correct hits; published memory is released on a thread that
called into the Cache, never on the library's worker."""
import gc
import threading

import torch

import ectest
from ectest import F32, TIMEOUT, lookup_one, publish_one, sample


def _release_from_another_thread(fault, which, start):
    """Starts a thread that, once `start` returns True (it may wait),
    runs Python code and then releases the held operations of `which`.
    Returns the thread and the list it records its progress in."""
    progress = []

    def run():
        if start():
            progress.append(sum(range(1000)))  # bytecode: needs the GIL
            fault.hold(which, False)

    th = threading.Thread(target=run, daemon=True)
    th.start()
    return th, progress


def test_gil_released_during_a_lookup(open_cache, shm, fault):
    url = shm(scheme="pyfault")
    c = open_cache(url)
    t = sample(256, 256)  # 256 KiB
    publish_one(c, "large", t)
    fault.hold(fault.READS)
    th, progress = _release_from_another_thread(
        fault, fault.READS, lambda: fault.wait_held(fault.READS))
    r = lookup_one(c, "large", F32, (256, 256))  # the read waits for `th`
    th.join(TIMEOUT)
    assert progress, "the other thread made no progress"
    assert fault.timed_out(fault.READS) == 0, \
        "the read was released by its bound: the GIL was held during it"
    assert r.hit and ectest.torch_bits_equal(r.tensor, t)


def test_gil_released_during_a_flush(open_cache, shm, fault):
    c = open_cache(shm(scheme="pyfault"))
    fault.hold(fault.WRITES)
    publish_one(c, "f", sample(64, 64), flush=False)
    assert fault.wait_held(fault.WRITES)
    entering = threading.Event()
    th, progress = _release_from_another_thread(
        fault, fault.WRITES, lambda: entering.wait(TIMEOUT))
    entering.set()
    c.flush()  # waits for the held write, which `th` releases
    th.join(TIMEOUT)
    assert progress and fault.timed_out(fault.WRITES) == 0
    assert c.stats().published_written == 1


def _expected(k):
    return torch.arange(32, dtype=F32).reshape(4, 8) + 100 * k


def _worker(cache, tid, steps, barrier, hits, errors):
    try:
        barrier.wait(TIMEOUT)
        for j in range(steps):
            ids = sorted({(tid + j) % 20, (tid * 7 + 3 * j) % 20})
            with cache.lookup([(f"k{k}", F32, (4, 8)) for k in ids]) as step:
                for k, r in zip(ids, step.results):
                    if r.hit:
                        assert torch.equal(r.tensor, _expected(k)), k
                        hits.append(k)
                    else:
                        step.publish(r.id, _expected(k))
    except Exception as e:  # re-raised on the main thread
        errors.append(e)


def test_shared_by_four_threads(open_cache):
    c = open_cache()
    barrier, hits, errors = threading.Barrier(4), [], []
    threads = [threading.Thread(target=_worker,
                                args=(c, tid, 40, barrier, hits, errors))
               for tid in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(TIMEOUT)
    assert not any(th.is_alive() for th in threads)
    assert not errors, errors
    c.flush()
    assert hits, "no thread ever hit"
    with c.lookup([(f"k{k}", F32, (4, 8)) for k in range(20)]) as step:
        for k, r in enumerate(step.results):
            assert r.hit and torch.equal(r.tensor, _expected(k)), k
    st = c.stats()
    assert st.steps_open == 0 and st.published_written == 20


def test_release_on_the_reaping_thread(open_cache, shm, fault):
    c = open_cache(shm(scheme="pyfault"))
    fault.hold(fault.WRITES)
    made = []

    def publisher():
        t, fin, freed = ectest.owned_tensor(4, 4)
        made.append((fin, freed))
        publish_one(c, "rel", t, flush=False)

    th = threading.Thread(target=publisher)
    th.start()
    th.join(TIMEOUT)
    (fin, freed), = made
    assert fault.wait_held(fault.WRITES)
    # A CPU tensor's bytes were copied at the call: the publisher thread
    # dropped the last reference to its memory, the library's held none.
    gc.collect()
    assert not fin.alive and freed == [th.ident]
    fault.hold(fault.WRITES, False)
    assert fault.wait_finished(fault.WRITES)
    assert c.stats().pending_items == 1  # reaped only by a call
    c.flush()
    assert c.stats().pending_items == 0


def test_release_on_calling_threads_only(open_cache):
    c = open_cache()
    callers, fins, errors = {threading.get_ident()}, [], []

    def publisher(tid):
        callers.add(threading.get_ident())
        try:
            for j in range(20):
                t, fin, freed = ectest.owned_tensor(4, 4, seed=j)
                fins.append((fin, freed))
                publish_one(c, f"t{tid}-{j}", t, flush=j % 5 == 4)
        except Exception as e:
            errors.append(e)

    threads = [threading.Thread(target=publisher, args=(i,)) for i in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(TIMEOUT)
    assert not errors, errors
    c.flush()
    gc.collect()
    assert all(not fin.alive for fin, _ in fins)
    released_on = {tid for _, freed in fins for tid in freed}
    assert released_on <= callers, (released_on, callers)
