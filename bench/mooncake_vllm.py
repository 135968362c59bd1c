# SPDX-License-Identifier: Apache-2.0
"""bench/mooncake_vllm.py: encache against vLLM's own reuse code on one
real Mooncake Store, in one run (issue 43; docs/performance.md).

(a) A lookup of 4 hits at 16 KiB, 1 MiB and 8 MiB (float32 outputs):
    encache's Cache.lookup(), on the route this process takes to Mooncake
    (encache.mooncake_route()), against vLLM's lookup path,
    MooncakeEmbeddingStoreBackend.resolve_inputs() (vllm/distributed/
    ec_transfer/ec_connector/mooncake_store_embedding/backend.py: a
    batch_is_exist, a batch_get_into into its registered read buffer,
    the header checks, a copy into a new tensor each), on the same Store
    and objects, in alternating rounds; p50 of each and their ratio,
    encache / vLLM (goal <= 0.85).
(b) Publication: objects of 1 MiB published through encache (publish of
    each, then flush: the existence check, the write) against the raw
    put_from of the same bytes under fresh keys from Mooncake's client,
    one after the other, in alternating rounds; objects/s of each and the
    ratio encache / raw (goal >= 0.9).

Run with a Python that has vLLM, Mooncake's package and encache, with
MOONCAKE_CONFIG_PATH naming the client JSON of a running Store (bash
tests/mooncake_real.sh runs it).  Prints figures; the exit status says
only whether it ran.
"""
import argparse
import os
import statistics
import sys
import time

import torch

import encache
from vllm.distributed.ec_transfer.ec_connector.mooncake_store_embedding \
    import backend as vllm_backend, data as vllm_data, \
    store_client as vllm_client

CONFIG = {"ec_connector": "ECMooncakeConnector", "ec_role": "ec_producer",
          "ec_connector_extra_config": {"cross_encoder_cache": True}}
# The publisher's bounds raised so that a round's objects are all queued.
WRITER = {"ec_connector": "ECMooncakeConnector", "ec_role": "ec_producer",
          "ec_connector_extra_config": {
              "cross_encoder_cache": True, "store_max_pending_items": 4096,
              "store_max_pending_bytes": 4 << 30}}
SIZES = [("16 KiB", 64, 64), ("1 MiB", 512, 512), ("8 MiB", 2048, 1024)]


def spec(rows, cols):
    return vllm_data.TensorSpec(shape=(rows, cols), dtype="torch.float32",
                                nbytes=rows * cols * 4)


def lookups(cache, vllm, rows, cols, rounds, tag):
    """p50 of a 4-hit lookup (ms): encache's and vLLM's."""
    ids = [f"{tag}-{rows}x{cols}-{i}" for i in range(4)]
    items = [encache.Item(i, torch.float32, (rows, cols)) for i in ids]
    with cache.lookup(items) as step:
        for i, r in zip(ids, step.results):
            if not r.hit:
                step.publish(i, torch.randn(rows, cols))
    cache.flush()
    specs = {i: spec(rows, cols) for i in ids}
    times = {"encache": [], "vllm": []}

    def ours():
        t0 = time.perf_counter()
        with cache.lookup(items) as step:
            hits = sum(r.hit for r in step.results)
        times["encache"].append(time.perf_counter() - t0)
        assert hits == 4, "encache: not 4 hits"

    def theirs():
        t0 = time.perf_counter()
        loaded = vllm.resolve_inputs(specs, {}, "cpu")
        times["vllm"].append(time.perf_counter() - t0)
        assert len(loaded) == 4, "vLLM: not 4 hits"

    for _ in range(3):  # warm both (first reads, registrations)
        ours(), theirs()
    times = {"encache": [], "vllm": []}
    for r in range(rounds):
        for f in ((ours, theirs) if r % 2 == 0 else (theirs, ours)):
            f()
    return (statistics.median(times["encache"]) * 1e3,
            statistics.median(times["vllm"]) * 1e3)


def publications(cache, raw, n, rounds, tag):
    """objects/s of encache's publication and of raw put_from (1 MiB)."""
    t = torch.randn(512, 512)
    ptr, size = t.data_ptr(), t.numel() * 4
    rates = {"encache": [], "raw": []}
    calls = []  # the publish() calls' share of each encache round

    def ours(r):
        ids = [f"{tag}-w{r}-{i}" for i in range(n)]
        before = cache.stats().published_written
        with cache.lookup([encache.Item(i, torch.float32, (512, 512))
                           for i in ids]) as step:
            t0 = time.perf_counter()
            for i in ids:
                step.publish(i, t)
            t1 = time.perf_counter()
            cache.flush()
            rates["encache"].append(n / (time.perf_counter() - t0))
            calls.append((t1 - t0) * rates["encache"][-1] / n)
        written = cache.stats().published_written - before
        assert written == n, f"encache wrote {written} of {n}"
        encache.purge("mooncake:", cache.namespace)

    def theirs(r):
        keys = [f"{tag}-raw-{r}-{i}" for i in range(n)]
        t0 = time.perf_counter()
        for k in keys:
            rc = raw.put_from(k, ptr, size)
            assert rc == 0, f"put_from answered {rc}"
        rates["raw"].append(n / (time.perf_counter() - t0))
        raw.remove_by_regex(f"^{tag}-raw-{r}-", True)

    for r in range(rounds):
        for f in ((ours, theirs) if r % 2 == 0 else (theirs, ours)):
            f(r)
    s = cache.stats()
    assert s.published_failed == 0 and not s.poisoned, s
    return (statistics.mean(rates["encache"]), statistics.mean(rates["raw"]),
            statistics.mean(calls))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=40,
                   help="lookups per size and side (default 40)")
    p.add_argument("--writes", type=int, default=64,
                   help="objects per publication round (default 64)")
    p.add_argument("--write-rounds", type=int, default=4,
                   help="publication rounds per side (default 4)")
    a = p.parse_args(argv)
    if not os.environ.get("MOONCAKE_CONFIG_PATH"):
        sys.exit("mooncake_vllm: MOONCAKE_CONFIG_PATH must name the client "
                 "JSON of a running Mooncake Store")
    import importlib.metadata as md
    tag = f"bench-{os.getpid()}-{time.time_ns()}"
    cache = encache.Cache(CONFIG, model=f"{tag}/model", dtype="float32",
                          store="mooncake:")
    client = vllm_client.create_mooncake_embedding_store_client()
    theirs_backend = vllm_backend.MooncakeEmbeddingStoreBackend(
        client, cache.namespace, max_pending_items=32,
        max_pending_bytes=1 << 30)
    mc = md.version("mooncake-transfer-engine-non-cuda")
    print(f"mooncake_vllm: encache {encache.__version__} (route "
          f"{cache.mooncake_route}), vLLM {vllm_version()}, Mooncake {mc}; "
          f"{a.rounds} alternating rounds")
    print("(a) 4 hits   encache p50   vLLM p50   encache/vLLM (goal <= 0.85)")
    for name, rows, cols in SIZES:
        ours, theirs = lookups(cache, theirs_backend, rows, cols, a.rounds,
                               tag)
        print(f"    {name:7} {ours:9.3f} ms {theirs:9.3f} ms   "
              f"{ours / theirs:.2f}")
    writer = encache.Cache(WRITER, model=f"{tag}/writes", dtype="float32",
                           store="mooncake:")
    ours, theirs, calls = publications(writer, client.store, a.writes,
                                       a.write_rounds, tag)
    print(f"(b) publication of 1 MiB objects: encache {ours:.0f} objects/s, "
          f"raw put_from {theirs:.0f} objects/s, encache/raw "
          f"{ours / theirs:.2f} (goal >= 0.9); the publish() calls took "
          f"{calls:.0%} of encache's time")
    writer.close()
    cache.close()
    theirs_backend.shutdown()
    return 0


def vllm_version():
    import vllm
    return vllm.__version__


if __name__ == "__main__":
    sys.exit(main())
