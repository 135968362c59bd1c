# SPDX-License-Identifier: Apache-2.0
"""python3 -m encache.vllm.bench: what the vLLM connector adds to a step.

In one run, on one Store (a private shared-memory segment by default) and
one Cache, for 4 hits of 16 KiB and of 1 MiB (float32 rows x 1024):
  bare       the library's lookup as an encoder calls it: Cache.lookup()
             of the 4 items, its hits put in an encoder cache (Step.hits),
             Step.close();
  connector  the worker half of EncacheECConnector through one step, as
             vLLM's model runner calls it: bind_connector_metadata (the
             step's plan of 4 candidates), start_save_caches into an empty
             encoder cache (the 4 hits land there), clear_connector_metadata;
and, apart, the scheduler half's build_connector_meta for the same step.
Goal (issue 31): the connector's step under 5 % above the bare lookup.
--prefetch adds scheduler_prefetch (4 new objects per step, in Redis
alone, so that every read starts remote) on plain Redis and on a tier
(tier:shm+redis), with the worker half in the scheduler half's process
(vLLM's single-GPU executor: the prefetched hits are handed over) and, on
the tier, as if it were not (the tier's host shm keeps them): the
scheduler half plans the step (its lookup starts), a gap passes (what
vLLM does before the worker runs the step: --gap-ms), then the worker's
step is timed, against the same step without prefetch (and, on the tier
of two processes, the same step on the host's shm alone: the floor).  Goal: under 10 % of the read waited.
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
    """The same step without the connector: an encoder's own lookup, its
    hits put in its encoder cache by identifier (as the connector puts
    them, and as the encoder then uses them, through Step.hits: the
    library's quickest way), the step closed."""
    encoder_cache: dict = {}
    t0 = time.perf_counter()
    step = cache.lookup(items)
    encoder_cache.update(step.hits)
    step.close()
    t = time.perf_counter() - t0
    if len(encoder_cache) != len(items):
        raise SystemExit(f"bench: the bare lookup missed "
                         f"({len(encoder_cache)} of {len(items)} hits)")
    del step
    return t


def _worker_step(worker, meta, n: int = NOBJ) -> float:
    """The time of one worker step of the connector, as vLLM's model
    runner calls it; every one of its n hits must land."""
    encoder_cache: dict = {}
    t0 = time.perf_counter()
    worker.bind_connector_metadata(meta)
    worker.start_save_caches(encoder_cache=encoder_cache)
    worker.clear_connector_metadata()
    t = time.perf_counter() - t0
    if len(encoder_cache) != n:
        raise SystemExit(f"bench: the connector's step missed "
                         f"({len(encoder_cache)} of {n} hits)")
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
                conn_t += [_worker_step(worker, meta) for _ in range(block)]
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


# ------------------------------------------------- scheduler_prefetch

PREFETCH_SIZES = [(1 << 20, "1 MiB"), (8 << 20, "8 MiB")]


def _free_port() -> int:
    import socket
    with socket.socket() as so:
        so.bind(("127.0.0.1", 0))
        return so.getsockname()[1]


def _redis_ping(port: int) -> bool:
    import socket
    try:
        with socket.create_connection(("127.0.0.1", port), 0.2) as so:
            so.sendall(b"PING\r\n")
            return so.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def start_redis():
    """A private redis-server on a free loopback port (no persistence):
    (process, URL), or None when redis-server is not on PATH."""
    import shutil
    import subprocess
    if shutil.which("redis-server") is None:
        return None
    port = _free_port()
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1",
         "--save", "", "--appendonly", "no", "--maxmemory", "1gb",
         "--maxmemory-policy", "allkeys-lru"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while not _redis_ping(port):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            raise SystemExit("bench: redis-server did not start")
        time.sleep(0.05)
    return proc, f"redis://127.0.0.1:{port}"


def _step_meta(sched, ids, rows, tag):
    feats = [types.SimpleNamespace(
        identifier=i, modality="image",
        mm_position=types.SimpleNamespace(get_num_embeds=lambda r=rows: r))
        for i in ids]
    so = types.SimpleNamespace(
        scheduled_new_reqs=[types.SimpleNamespace(req_id=tag,
                                                  mm_features=feats)],
        scheduled_encoder_inputs={tag: list(range(len(ids)))})
    return sched.build_connector_meta(so)


# The shapes of deployment --prefetch times: (name, Store, whether the
# worker half shares the scheduler half's process).  vLLM's single-GPU
# executor runs the worker in the engine core's process (the prefetched
# hits are handed over); with its multiprocessing or Ray executors the
# worker is another process, where only a tier keeps what the prefetch
# read (scheduler_prefetch_bytes 0 times that here).
PREFETCH_MODES = [("redis, one process", "redis", True),
                  ("tier, one process", "tier", True),
                  ("tier, two processes", "tier", False)]


def bench_prefetch(redis: str, rounds: int, gaps_ms) -> list[dict]:
    """The part of the Store read a step still waits for with
    scheduler_prefetch, per deployment shape of PREFETCH_MODES, against
    the same step without prefetch, for 4 hits of 1 MiB and 8 MiB, per
    gap.  A worker and two scheduler halves (prefetch on, off) per shape
    live for the whole run, as in vLLM; every step is of 4 new objects,
    written to Redis alone before it, so that every read starts remote.
    On a tier of two processes, after each prefetched step the same step
    again is the floor: the 4 objects in the host's shm."""
    import torch
    remote = ecc.EncacheECConnector(_vllm_config(redis),
                                    ecc.ECConnectorRole.WORKER)
    made, segments, out = [remote], [], []
    k = 0
    try:
        cache = remote.core.cache
        for mode, kind, handoff in PREFETCH_MODES:
            url = redis
            if kind == "tier":
                local = f"encache-vllmbench-tier-{os.getpid()}-{len(segments)}"
                segments.append(local)
                url = f"tier:shm://{local}?size=512MiB+{redis}"
            worker = ecc.EncacheECConnector(_vllm_config(url),
                                            ecc.ECConnectorRole.WORKER)
            made.append(worker)
            sched_off = ecc.EncacheECConnector(_vllm_config(url),
                                               ecc.ECConnectorRole.SCHEDULER)
            made.append(sched_off)
            on = _vllm_config(url)
            extra = on.ec_transfer_config.ec_connector_extra_config
            extra["scheduler_prefetch"] = True
            if not handoff:
                extra["scheduler_prefetch_bytes"] = 0
            sched_on = ecc.EncacheECConnector(on,
                                              ecc.ECConnectorRole.SCHEDULER)
            made.append(sched_on)
            for size, label in PREFETCH_SIZES:
                rows = size // (4 * COLS)
                for gap_ms in gaps_ms:
                    off_t, on_t, floor = [], [], []
                    for r in range(2 * rounds):  # alternate: one machine
                        k += 1
                        ids = [f"vbench-pf-{os.getpid()}-{k}-{i}"
                               for i in range(NOBJ)]
                        items = [encache.Item(i, "float32", (rows, COLS))
                                 for i in ids]
                        with cache.lookup(items) as s:
                            for n, i in enumerate(ids):
                                s.publish(i, torch.full((rows, COLS),
                                                        float(n)))
                        cache.flush()
                        sched = sched_on if r % 2 else sched_off
                        meta = _step_meta(sched, ids, rows, f"t{k}")
                        time.sleep(gap_ms / 1e3)
                        t = _worker_step(worker, meta, NOBJ)
                        (on_t if r % 2 else off_t).append(t)
                        if r % 2:
                            sched_on.core.prefetcher.wait()
                            if kind == "tier" and not handoff:
                                time.sleep(0.05)  # the promotions written
                                floor.append(_worker_step(worker, meta,
                                                          NOBJ))
                    o50 = statistics.median(off_t)
                    p50 = statistics.median(on_t)
                    f50 = statistics.median(floor) if floor else None
                    out.append({
                        "mode": mode, "size": label, "gap_ms": gap_ms,
                        "read_p50_us": o50 * 1e6,
                        "prefetched_p50_us": p50 * 1e6,
                        "local_p50_us": f50 * 1e6 if floor else None,
                        "waited_pct": p50 / o50 * 100,
                        "waited_over_local_pct":
                            (p50 - f50) / (o50 - f50) * 100 if floor
                            else None})
    finally:
        for c in reversed(made):
            c.shutdown()
        for local in segments:
            encache.shm_destroy(local)
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
    p.add_argument("--prefetch", action="store_true",
                   help="also time scheduler_prefetch on Redis and on a "
                   "tier in front of it (--redis, else $ENCACHE_REDIS_URL, else a "
                   "private redis-server)")
    p.add_argument("--redis", help="the Redis URL of --prefetch")
    p.add_argument("--rounds", type=int, default=15,
                   help="steps per side of --prefetch")
    p.add_argument("--gap-ms", default="2,50",
                   help="--prefetch: time between planning and the "
                   "worker's step, ms (comma-separated)")
    args = p.parse_args(argv)
    own = args.store is None
    name = f"encache-vllmbench-{os.getpid()}"
    store = args.store or f"shm://{name}?size=256MiB"
    try:
        figs = bench(store, max(10, args.iterations))
    finally:
        if own:
            encache.shm_destroy(name)
    pf = []
    if args.prefetch:
        server = None
        redis = args.redis or os.environ.get("ENCACHE_REDIS_URL")
        if not redis:
            server = start_redis()
            if server is None:
                raise SystemExit("bench: --prefetch needs --redis or "
                                 "redis-server on PATH")
            redis = server[1]
        try:
            pf = bench_prefetch(redis, max(3, args.rounds),
                                [float(g) for g in args.gap_ms.split(",")])
        finally:
            if server is not None:
                server[0].terminate()
                server[0].wait()
    if args.json:
        json.dump({"step": figs, "prefetch": pf} if args.prefetch else figs,
                  sys.stdout, indent=2)
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
    if pf:
        print(f"scheduler_prefetch in front of {encache.url_redact(redis)}"
              f" (4 objects new to the host per step), worker's step p50")
        print(f"{'shape':>20} {'size':>6} {'gap ms':>6} "
              f"{'no prefetch us':>14} {'prefetch us':>11} {'local us':>8}"
              f" {'waited %':>8} {'over local %':>12}")
        for r in pf:
            local = "-" if r["local_p50_us"] is None \
                else f"{r['local_p50_us']:.0f}"
            over = "-" if r["waited_over_local_pct"] is None \
                else f"{r['waited_over_local_pct']:.1f}"
            print(f"{r['mode']:>20} {r['size']:>6} {r['gap_ms']:>6g} "
                  f"{r['read_p50_us']:>14.0f} {r['prefetched_p50_us']:>11.0f}"
                  f" {local:>8} {r['waited_pct']:>8.1f} {over:>12}")
        print("    one process: the worker shares the scheduler's process "
              "(vLLM's single-GPU executor) and takes the prefetched hits;")
        print("    two processes: it does not (scheduler_prefetch_bytes 0),"
              " and the tier's host shm keeps them; local: that step again")
        print("    with the objects in the host's shm; over local: "
              "(prefetch - local) / (no prefetch - local)")
        print("    goal: waited under 10 % of the read")
    return 0


if __name__ == "__main__":
    sys.exit(main())
