# SPDX-License-Identifier: Apache-2.0
"""python3 -m encache.vllm.bench: what the vLLM connector adds to a step.

In one run, on one Store (a private shared-memory segment by default) and
one Cache, for 4 hits of 16 KiB and of 1 MiB (float32 rows x 1024):
  bare       the library's lookup as an encoder calls it: Cache.lookup()
             of the 4 items and Step.close(), outputs dropped;
  connector  the worker half of EncacheECConnector through one step, as
             vLLM's model runner calls it: bind_connector_metadata (the
             step's plan of 4 candidates), start_save_caches into an empty
             encoder cache (the 4 hits land there), clear_connector_metadata;
and, apart, the scheduler half's build_connector_meta for the same step.
Goal (issue 31): the connector's step under 5 % above the bare lookup.
Rounds of both sides alternate, so that both see the same machine.
Figures, not a pass/fail: the exit status is 0 unless something failed.
Runs without vLLM (the connector binds to its stand-in base).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import types

import encache

from . import _core
from . import connector as ecc

COLS = 1024
SIZES = [(16 << 10, "16 KiB"), (1 << 20, "1 MiB")]
NOBJ = 4


def _vllm_config(store: str):
    extra = {"cross_encoder_cache": True, "store_url": store,
             "inner_ec_connector": "", "stats_segment": "off",
             "store_max_pending_items": 64,
             "store_max_pending_bytes": 1 << 30}
    ec = types.SimpleNamespace(
        ec_connector=_core.CONNECTOR_NAME, ec_role="ec_producer",
        ec_connector_extra_config=extra, engine_id="bench",
        ec_rank=0, is_ec_producer=True, is_ec_consumer=False)
    mm = types.SimpleNamespace(compute_hash=lambda: "bench",
                               mm_processor_cache_gb=4)
    mc = types.SimpleNamespace(model="bench/vllm", revision=None,
                               dtype="float32", multimodal_config=mm,
                               get_hidden_size=lambda: COLS)
    return types.SimpleNamespace(ec_transfer_config=ec, model_config=mc,
                                 device_config=None)


def _pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def _bare(cache, items):
    t0 = time.perf_counter()
    step = cache.lookup(items)
    step.close()
    del step
    return time.perf_counter() - t0


def _connector(worker, meta):
    encoder_cache: dict = {}
    t0 = time.perf_counter()
    worker.bind_connector_metadata(meta)
    worker.start_save_caches(encoder_cache=encoder_cache)
    worker.clear_connector_metadata()
    t = time.perf_counter() - t0
    if len(encoder_cache) != NOBJ:
        raise SystemExit("bench: the connector's step missed")
    return t


def bench(store: str, iters: int) -> list[dict]:
    config = _vllm_config(store)
    worker = ecc.EncacheECConnector(config, ecc.ECConnectorRole.WORKER)
    sched = ecc.EncacheECConnector(config, ecc.ECConnectorRole.SCHEDULER)
    cache = worker.core.cache
    out = []
    try:
        for size, label in SIZES:
            rows = size // (4 * COLS)
            ids = [f"vbench-{os.getpid()}-{rows}-{i}" for i in range(NOBJ)]
            items = [encache.Item(i, "float32", (rows, COLS)) for i in ids]
            with cache.lookup(items) as s:
                for k, i in enumerate(ids):
                    s.publish(i, __import__("torch").full((rows, COLS),
                                                          float(k)))
            cache.flush()
            # The scheduler's view of the step: one new request with the
            # 4 images, all scheduled for encoding.
            feats = [types.SimpleNamespace(
                identifier=i, modality="image",
                mm_position=types.SimpleNamespace(
                    get_num_embeds=lambda r=rows: r)) for i in ids]
            so = types.SimpleNamespace(
                scheduled_new_reqs=[types.SimpleNamespace(
                    req_id=f"r{rows}", mm_features=feats)],
                scheduled_encoder_inputs={f"r{rows}": list(range(NOBJ))})
            meta = sched.build_connector_meta(so)
            bare_t, conn_t, sched_t = [], [], []
            block = max(1, iters // 10)
            for _ in range(0, iters, block):
                bare_t += [_bare(cache, items) for _ in range(block)]
                conn_t += [_connector(worker, meta) for _ in range(block)]
                for _ in range(block):
                    t0 = time.perf_counter()
                    sched.build_connector_meta(so)
                    sched_t.append(time.perf_counter() - t0)
            b50, c50 = statistics.median(bare_t), statistics.median(conn_t)
            out.append({
                "size": label, "bare_p50_us": b50 * 1e6,
                "connector_p50_us": c50 * 1e6,
                "bare_p99_us": _pct(bare_t, 0.99) * 1e6,
                "connector_p99_us": _pct(conn_t, 0.99) * 1e6,
                "added_us": (c50 - b50) * 1e6,
                "added_pct": (c50 / b50 - 1) * 100,
                "scheduler_p50_us": statistics.median(sched_t) * 1e6})
    finally:
        worker.shutdown()
        sched.shutdown()
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python3 -m encache.vllm.bench",
        description="Per-step cost of the vLLM connector over the bare "
        "library lookup, measured in one run on one Store.")
    p.add_argument("--store", help="Store URL (default: a private shm "
                   "segment, destroyed at the end)")
    p.add_argument("--iterations", type=int, default=200)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    own = args.store is None
    name = f"encache-vllmbench-{os.getpid()}"
    store = args.store or f"shm://{name}?size=256MiB"
    try:
        figs = bench(store, max(10, args.iterations))
    finally:
        if own:
            encache.shm_destroy(name)
    if args.json:
        json.dump(figs, sys.stdout, indent=2)
        print()
        return 0
    print(f"encache vLLM connector vs the bare lookup, one run on "
          f"{encache.url_redact(store)}: 4 hits per step, p50 (p99)")
    print(f"{'size':>8} {'bare us':>18} {'connector us':>18} "
          f"{'added us':>9} {'added %':>8} {'sched us':>9}")
    for r in figs:
        print(f"{r['size']:>8} {r['bare_p50_us']:>8.1f} "
              f"({r['bare_p99_us']:>7.1f}) {r['connector_p50_us']:>8.1f} "
              f"({r['connector_p99_us']:>7.1f}) {r['added_us']:>9.1f} "
              f"{r['added_pct']:>8.1f} {r['scheduler_p50_us']:>9.1f}")
    print("    goal: added under 5 % of the bare lookup")
    return 0


if __name__ == "__main__":
    sys.exit(main())
