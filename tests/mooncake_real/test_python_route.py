# SPDX-License-Identifier: Apache-2.0
"""encache on a real Mooncake Store from Mooncake's wheel, in a Python
process, through the route it takes there: Mooncake's Python client behind
the package's C ABI (encache/_mooncake.py, python/mooncake_py/mooncake_py.c), or
Mooncake's own C ABI when a libmooncake_store.so is installed.  Every hit
is compared bit for bit with what was published."""
import os
import subprocess
import sys
import threading

import pytest
import torch

import ectest
import encache
from ectest import BF16, F16, F32, same_bits, sample, unique
from encache import Outcome

# (rows, cols) of float32 outputs of 16 KiB, 1 MiB and 8 MiB.
SIZES = [(64, 64), (512, 512), (2048, 1024)]
# The route the suite expects: "python" unless the run names a C library.
ROUTE = os.environ.get("ENCACHE_EXPECT_MOONCAKE_ROUTE", "python")


def test_the_route_is_said(open_cache):
    assert encache.mooncake_route("mooncake:") == ROUTE
    c = open_cache()
    assert c.mooncake_route == ROUTE
    lib = os.environ.get("ENCACHE_MOONCAKE_LIBRARY", "")
    if ROUTE == "python":
        assert os.path.basename(lib) == "libencache_mooncake_py.so", lib
        assert os.path.exists(lib)
    assert encache.mooncake_route("shm://x?size=1MiB") is None
    assert encache.mooncake_route("tier:shm://x?size=1MiB+mooncake:") == ROUTE


@pytest.mark.parametrize("dtype", [F32, F16, BF16])
@pytest.mark.parametrize("rows,cols", SIZES)
def test_round_trip_is_bit_exact(open_cache, rows, cols, dtype):
    writer, reader = open_cache(), open_cache()
    id_ = unique("rt")
    want = sample(rows, cols, dtype, seed=rows + cols)
    ectest.publish_one(writer, id_, want)
    assert writer.stats().published_written == 1
    r = ectest.lookup_one(reader, id_, dtype, (rows, cols))
    assert r.outcome == Outcome.HIT, r.why
    assert same_bits(r.tensor, want)
    s = reader.stats()
    assert (s.hits, s.misses, s.unavailable) == (1, 0, 0)
    assert not s.poisoned


def test_a_second_publication_finds_the_object_there(open_cache):
    """Two encoders miss the same image; the second one's write finds the
    first one's object (Mooncake's put would answer success either way:
    the existence check tells written from present)."""
    a, b = open_cache(), open_cache()
    id_ = unique("twice")
    t = sample(64, 64)
    steps = [c.lookup([(id_, F32, (64, 64))]) for c in (a, b)]
    assert all(s.results[0].outcome == Outcome.MISS for s in steps)
    assert steps[0].publish(id_, t) == encache.Skip.QUEUED
    a.flush()
    assert steps[1].publish(id_, t) == encache.Skip.QUEUED
    b.flush()
    for s in steps:
        s.close()
    assert (a.stats().published_written, a.stats().published_present) == (1, 0)
    assert (b.stats().published_written, b.stats().published_present) == (0, 1)
    assert not a.stats().poisoned and not b.stats().poisoned


def test_a_missing_object_is_a_miss(open_cache):
    c = open_cache()
    r = ectest.lookup_one(c, unique("none"), F32, (512, 512))
    assert r.outcome == Outcome.MISS
    assert "not in the Store" in r.why
    s = c.stats()
    assert (s.misses, s.unavailable, s.poisoned) == (1, 0, False)


def test_hits_of_a_mebibyte_are_read_into_the_tensors(open_cache):
    """The package lends headroom: each object lands in its tensor, header
    in front (docs/stores.md), with no staging buffer."""
    writer, reader = open_cache(), open_cache()
    ids = [unique("direct") for _ in range(4)]
    outs = [sample(512, 512, seed=i) for i in range(4)]
    for id_, t in zip(ids, outs):
        ectest.publish_one(writer, id_, t, flush=False)
    writer.flush()
    with reader.lookup([(i, F32, (512, 512)) for i in ids]) as step:
        for r, want in zip(step.results, outs):
            assert r.outcome == Outcome.HIT, r.why
            assert same_bits(r.tensor, want)
    s = reader.stats()
    assert s.staging_allocations == 0 and s.batched_reads == 1


def test_a_started_lookup_waits_for_its_hits(open_cache):
    writer, reader = open_cache(), open_cache()
    ids = [unique("async") for _ in range(3)]
    outs = [sample(256, 256, seed=i) for i in range(3)]
    for id_, t in zip(ids, outs):
        ectest.publish_one(writer, id_, t, flush=False)
    writer.flush()
    step = reader.lookup([(i, F32, (256, 256)) for i in ids]
                         + [(unique("async-miss"), F32, (256, 256))],
                         wait=False)
    with step:
        step.wait()
        got = [r.outcome for r in step.results]
        assert got == [Outcome.HIT] * 3 + [Outcome.MISS]
        for r, want in zip(step.results, outs):
            assert same_bits(r.tensor, want)


def test_threads_share_a_store_while_python_runs(open_cache):
    """Lookups on four threads (the client's calls take and release the
    GIL) while this thread keeps running Python: every hit exact."""
    writer = open_cache()
    ids = [unique("thr") for _ in range(8)]
    outs = [sample(1024, 512, seed=i) for i in range(8)]  # 2 MiB each
    for id_, t in zip(ids, outs):
        ectest.publish_one(writer, id_, t, flush=False)
    writer.flush()
    caches = [open_cache() for _ in range(4)]
    errors = []

    def reader(c):
        try:
            for _ in range(5):
                with c.lookup([(i, F32, (1024, 512)) for i in ids]) as step:
                    for r, want in zip(step.results, outs):
                        assert r.outcome == Outcome.HIT, r.why
                        assert same_bits(r.tensor, want)
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=reader, args=(c,)) for c in caches]
    for t in threads:
        t.start()
    python_ran = 0
    while any(t.is_alive() for t in threads):
        python_ran += 1  # this thread holds the GIL between the joins
        threads[0].join(0.001)
    for t in threads:
        t.join(ectest.TIMEOUT)
    assert not errors, errors
    assert python_ran > 0
    assert all(c.stats().hits == 40 for c in caches)


def test_a_tier_over_mooncake_serves_from_shared_memory(open_cache, shm):
    local = shm()
    url = local.replace("shm://", "tier:shm://", 1) + "+mooncake:"
    writer = open_cache()
    id_ = unique("tier")
    want = sample(512, 512, seed=7)
    ectest.publish_one(writer, id_, want)
    c = open_cache(url)
    assert c.mooncake_route == ROUTE
    for _ in range(2):
        r = ectest.lookup_one(c, id_, F32, (512, 512))
        assert r.outcome == Outcome.HIT, r.why
        assert same_bits(r.tensor, want)


def test_single_flight_on_mooncake_encodes_every_miss(open_cache):
    """Mooncake has no leases: single flight takes none there and every
    miss is the encoder's (docs/stores.md)."""
    c = open_cache(ec_transfer_config=ectest.config(single_flight=True))
    id_ = unique("sf")
    r = ectest.lookup_one(c, id_, F32, (64, 64))
    assert r.outcome == Outcome.MISS
    s = c.stats()
    assert (s.leases_taken, s.in_flight) == (0, 0)


def test_purge_removes_a_namespace(open_cache):
    c = open_cache(model=unique("purge-model"))
    ids = [unique("purge") for _ in range(3)]
    for id_ in ids:
        ectest.publish_one(c, id_, sample(64, 64), flush=False)
    c.flush()
    # Not read yet: no read lease holds them (a read's lasts 10 s).
    objects, _ = encache.purge("mooncake:", c.namespace)
    assert objects == 3
    for id_ in ids:
        assert ectest.lookup_one(c, id_, F32, (64, 64)).outcome == Outcome.MISS


def test_the_console_script_takes_the_same_route(mooncake):
    """`encache` of a pip install runs the tool; a Mooncake Store named on
    its command line takes this Python's route (encache/_tool.py)."""
    script = os.path.join(os.path.dirname(sys.executable), "encache")
    if not os.path.exists(os.path.join(os.path.dirname(encache.__file__),
                                       "_bin", "encache")):
        pytest.skip("encache is not installed with pip here: no tool")
    env = {k: v for k, v in os.environ.items()
           if k not in ("ENCACHE_MOONCAKE_LIBRARY", "ENCACHE_MOONCAKE_PYTHON")}
    if ROUTE != "python":
        env["ENCACHE_MOONCAKE_LIBRARY"] = os.environ["ENCACHE_MOONCAKE_LIBRARY"]
    p = subprocess.run([script, "--store", mooncake, "stats"], env=env,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "kind          mooncake" in p.stdout


def test_objects_are_shared_with_another_process(open_cache, mooncake):
    """A child process (its own interpreter and Mooncake client) reads what
    this one wrote, and writes what this one reads."""
    c = open_cache()
    mine, theirs = unique("mine"), unique("theirs")
    want = sample(512, 256, seed=3)
    ectest.publish_one(c, mine, want)
    code = f"""
import sys, torch
sys.path[:0] = {sys.path!r}
import ectest, encache
from encache import Outcome
c = ectest.open_cache("mooncake:")
r = ectest.lookup_one(c, {mine!r}, torch.float32, (512, 256))
assert r.outcome == Outcome.HIT, r.why
assert ectest.same_bits(r.tensor, ectest.sample(512, 256, seed=3))
ectest.publish_one(c, {theirs!r}, ectest.sample(512, 256, seed=4))
c.close()
print("child ok")
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True,
                       text=True, timeout=120)
    assert "child ok" in p.stdout, p.stderr[-3000:]
    r = ectest.lookup_one(c, theirs, F32, (512, 256))
    assert r.outcome == Outcome.HIT, r.why
    assert same_bits(r.tensor, sample(512, 256, seed=4))
