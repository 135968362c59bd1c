# SPDX-License-Identifier: Apache-2.0
"""python3 -m encache.bench: what the Python binding adds to the C library.

In one run, on one Store (a private shared-memory segment by default), on
one Cache:
  (a) a lookup of 4 hits of 16 KiB, 1 MiB and 8 MiB: the C lookup alone
      (encache_lookup into malloc'd destinations, timed inside the
      extension) against Cache.lookup() returning torch tensors (or NumPy
      arrays) filled in place; targets: Python within 1.1x of C from 1 MiB
      up, and under 15 us added per call at 16 KiB;
  (b) publish on the caller's thread, outputs of 16 KiB, 1 MiB and 8 MiB:
      encache_publish() from C against Step.publish(id, tensor), which
      copies a CPU tensor's bytes at the call (the publish-time snapshot,
      docs/python.md); target: under 10 us per call at 16 KiB; the copy's
      cost is shown per call and as the copy rate.
Rounds of C and Python alternate, so that both see the same machine.
Figures, not a pass/fail: the exit status is 0 unless something failed.
"""

import argparse
import json
import os
import statistics
import sys
import time

import encache
from encache import _encache

COLS = 1024  # float32 rows x 1024: 4 KiB per row
SIZES = [(16 << 10, "16 KiB"), (1 << 20, "1 MiB"), (8 << 20, "8 MiB")]
NOBJ = 4


def _parse(argv):
    p = argparse.ArgumentParser(
        prog="python3 -m encache.bench",
        description="Per-call cost of the Python binding over the C "
        "library, measured in one run on one Store.")
    p.add_argument("--store", help="Store URL (default: a private shm "
                   "segment, destroyed at the end)")
    p.add_argument("--iterations", type=int, default=200,
                   help="timed lookups per size and side (default 200)")
    p.add_argument("--output", choices=("torch", "numpy"), default=None,
                   help="what hits come back as (default: torch if "
                   "installed)")
    p.add_argument("--json", action="store_true",
                   help="print the figures as JSON")
    args = p.parse_args(argv)
    if args.iterations < 10:
        p.error("--iterations must be at least 10")
    return args


def _pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def _fill(np_or_torch, rows, seed):
    """A float32 rows x COLS matrix of the chosen framework."""
    if np_or_torch.__name__ == "torch":
        g = np_or_torch.Generator().manual_seed(seed)
        return np_or_torch.rand((rows, COLS), generator=g)
    return np_or_torch.random.default_rng(seed).random(
        (rows, COLS), dtype=np_or_torch.float32)


def _py_lookup(cache, items):
    t0 = time.perf_counter()
    step = cache.lookup(items)
    step.close()
    del step  # frees the outputs, as the C loop frees its destinations
    return time.perf_counter() - t0


def bench_lookup(cache, fw, iters):
    """(a): rows of figures per size."""
    rows_out = []
    for size, label in SIZES:
        rows = size // (4 * COLS)
        ids = [f"bench-{label.replace(' ', '')}-{i}" for i in range(NOBJ)]
        with cache.lookup([(i, "float32", (rows, COLS)) for i in ids]) as s:
            for k, i in enumerate(ids):
                s.publish(i, _fill(fw, rows, k))
        cache.flush()
        items = [encache.Item(i, "float32", (rows, COLS)) for i in ids]
        if sum(r.hit for r in cache.lookup(items)) != NOBJ:
            raise SystemExit(f"bench: the {label} objects are not hits")
        c_t, py_t = [], []
        block = max(1, iters // 10)
        for _ in range(0, iters, block):
            c_t += _encache._bench_c_lookup(cache, ids, 0, rows, COLS, block)
            py_t += [_py_lookup(cache, items) for _ in range(block)]
        c50, p50 = statistics.median(c_t), statistics.median(py_t)
        rows_out.append({
            "size": label, "c_p50_us": c50 * 1e6, "py_p50_us": p50 * 1e6,
            "c_p99_us": _pct(c_t, 0.99) * 1e6,
            "py_p99_us": _pct(py_t, 0.99) * 1e6,
            "ratio": p50 / c50, "added_us": (p50 - c50) * 1e6})
    return rows_out


def bench_publish(cache, fw, count):
    """(b): per-call publish, C and Python, for each size of SIZES (count
    calls of each side at 16 KiB, fewer for the larger sizes)."""
    out_rows = []
    for nbytes, label in SIZES:
        rows, n = nbytes // (4 * COLS), max(16, count * (16 << 10) // nbytes)
        batch = min(16, max(1, (64 << 20) // nbytes))
        c_t = _encache._bench_c_publish(
            cache, f"cpub-{os.getpid()}-{rows}-", n, rows, COLS, batch)
        py_t = []
        out = _fill(fw, rows, 7)
        for k in range(0, n, batch):
            ids = [f"pypub-{os.getpid()}-{rows}-{k + i}"
                   for i in range(min(batch, n - k))]
            with cache.lookup([(i, "float32", (rows, COLS))
                               for i in ids]) as s:
                for i in ids:
                    t0 = time.perf_counter()
                    s.publish(i, out)
                    py_t.append(time.perf_counter() - t0)
            cache.flush()
        c50, p50 = statistics.median(c_t), statistics.median(py_t)
        added = p50 - c50
        out_rows.append({
            "size": label, "c_p50_us": c50 * 1e6, "py_p50_us": p50 * 1e6,
            "py_p99_us": _pct(py_t, 0.99) * 1e6, "added_us": added * 1e6,
            "copy_gbps": nbytes / added / 1e9 if added > 0 else None})
    return out_rows


def _print(figs, store, output):
    print(f"encache Python binding vs C, one run on {store} "
          f"(output: {output})")
    print("(a) lookup of 4 hits, p50 (p99) per call")
    print(f"{'size':>8} {'C us':>18} {'Python us':>18} {'Py/C':>6} "
          f"{'added us':>9}")
    for r in figs["lookup"]:
        print(f"{r['size']:>8} {r['c_p50_us']:>8.1f} ({r['c_p99_us']:>7.1f})"
              f" {r['py_p50_us']:>8.1f} ({r['py_p99_us']:>7.1f})"
              f" {r['ratio']:>6.3f} {r['added_us']:>9.1f}")
    print("    targets: Py/C <= 1.10 from 1 MiB up; added < 15 us at 16 KiB")
    print("(b) publish per call, p50 (Python p99); Python copies a CPU "
          "tensor at the call")
    print(f"{'size':>8} {'C us':>9} {'Python us':>20} {'added us':>9} "
          f"{'copy GB/s':>10}")
    for p in figs["publish"]:
        rate = f"{p['copy_gbps']:.1f}" if p["copy_gbps"] else "-"
        print(f"{p['size']:>8} {p['c_p50_us']:>9.2f} {p['py_p50_us']:>9.2f}"
              f" ({p['py_p99_us']:>8.2f}) {p['added_us']:>9.2f} {rate:>10}")
    print("    target: Python < 10 us at 16 KiB")


def main(argv=None):
    args = _parse(argv)
    own = args.store is None
    name = f"encache-pybench-{os.getpid()}"
    store = args.store or f"shm://{name}?size=256MiB"
    output = args.output or encache._default_output()
    fw = __import__("torch" if output == "torch" else "numpy")
    cfg = {"ec_connector_extra_config": {
        "cross_encoder_cache": True, "store_max_pending_items": 64,
        "store_max_pending_bytes": 1 << 30}}
    try:
        with encache.Cache(cfg, model="bench/python", dtype="float32",
                           store=store, output=output) as cache:
            figs = {"lookup": bench_lookup(cache, fw, args.iterations),
                    "publish": bench_publish(cache, fw, 512)}
    finally:
        if own:
            encache.shm_destroy(name)
    if args.json:
        json.dump(figs, sys.stdout, indent=2)
        print()
    else:
        _print(figs, encache.url_redact(store), output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
