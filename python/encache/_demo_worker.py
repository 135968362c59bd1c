# SPDX-License-Identifier: Apache-2.0
"""One encoder process of ``python3 -m encache.demo``.

It builds the VisionTransformer (one thread), says it is ready, then obeys
the parent's commands on its pipe:

  ("run", use_cache)  serve the request stream (the same one each time):
                      with the cache, look each request up, encode the
                      misses and publish them; without it, encode every
                      image.  Reply with a report of counters and latencies.
  ("verify",)         check every hit kept for verification that the run
                      without the cache has not checked, bit for bit,
                      against a fresh encode of its image; reply with the
                      counts of every check (of the baseline's too).
  ("quit",)           exit.

A failure is replied as ("error", why) and the process exits with 1.
The hits of the run with the cache are kept (one copy per distinct
content of an image) and checked bit for bit against the encodes of the
run without it, which encodes every image of the same request stream
afresh; the time of those checks is left out of the runs' times.
"""
import bisect
import os
import random
import sys
import time
import traceback
from dataclasses import dataclass

from ._demo_model import Encoder, ModelSpec

MAX_BATCH = 4  # images per request: 1 to MAX_BATCH
OUTCOMES = ("hit", "miss", "incompatible", "oversize", "unavailable",
            "skipped")
CONNECTOR_CONFIG = {
    "ec_connector": "ECMooncakeStorageConnector",
    "ec_role": "ec_producer",
    "ec_connector_extra_config": {"cross_encoder_cache": True,
                                  "embedding_cache_prefix": "pydemo"},
}


@dataclass(frozen=True)
class WorkerConfig:
    """What every encoder is given (pickled to the spawned process)."""

    spec: ModelSpec
    dtype: str          # "float32", "float16" or "bfloat16"
    store_url: str
    revision: str       # this run's own namespace
    requests: int
    skew: float
    seed: int
    verify: str         # "all", "sample" or "none"
    images: tuple       # of (id, pixels, name)


def zipf_cdf(n, s):
    weights = [1.0 / (i + 1) ** s for i in range(n)]
    total, acc, cdf = sum(weights), 0.0, []
    for w in weights:
        acc += w
        cdf.append(acc / total)
    cdf[-1] = 1.0
    return cdf


def request_stream(cfg, index):
    """The requests of encoder index: lists of image indices (seeded, so
    both runs serve the same stream)."""
    rng = random.Random(cfg.seed * 1000003 + index)
    cdf = zipf_cdf(len(cfg.images), cfg.skew)
    for _ in range(cfg.requests):
        n = rng.randint(1, MAX_BATCH)
        yield [bisect.bisect_left(cdf, rng.random()) for _ in range(n)]


def bit_view(t):
    """t's bits as integers, so that equality is bit for bit (NaN too)."""
    import torch
    return t.view({4: torch.int32, 2: torch.int16}[t.element_size()])


def new_verified():
    return {"checked": 0, "failed": 0, "fresh_encodes": 0, "failures": []}


class Worker:
    def __init__(self, cfg, index, done):
        import torch
        torch.set_num_threads(1)
        self.torch = torch
        self.cfg, self.index, self.done = cfg, index, done
        self.dtype = getattr(torch, cfg.dtype)
        self.encoder = Encoder(cfg.spec, self.dtype)
        self.kept = {}  # image index -> [[representative hit, count], ...]
        self.verified = new_verified()

    def run(self, use_cache):
        rep = {"requests": 0, "images": 0, "hits": 0, "hits_own": 0,
               "hits_other": 0, "encodes": 0, "encode_s": 0.0,
               "outcome": dict.fromkeys(OUTCOMES, 0), "hit_lat": [],
               "miss_lat": [], "kept_s": 0.0, "store_wait_s": 0.0}
        self.done[self.index] = 0
        if use_cache:
            self.kept.clear()
            with self._open_cache() as cache:
                t0 = time.perf_counter()
                self._run_cached(rep, cache)
                t1 = time.perf_counter()
        else:
            t0 = time.perf_counter()
            self._run_baseline(rep)
            t1 = time.perf_counter()
        # The time spent on verification is not the run's.
        rep["busy_s"] = t1 - t0 - rep.pop("kept_s")
        return rep

    def _run_baseline(self, rep):
        for picks in request_stream(self.cfg, self.index):
            for pick in picks:
                out = self._encode(rep, pick, 0.0)
                if pick in self.kept:  # a fresh encode to verify with
                    tk = time.perf_counter()
                    self._check(pick, out)
                    rep["kept_s"] += time.perf_counter() - tk
            self._request_done(rep)

    def _request_done(self, rep):
        rep["requests"] += 1
        self.done[self.index] = rep["requests"]

    def _encode(self, rep, pick, t_lookup):
        te = time.perf_counter()
        out = self.encoder.encode(self.cfg.images[pick][1])
        dt = time.perf_counter() - te
        rep["images"] += 1
        rep["encodes"] += 1
        rep["encode_s"] += dt
        rep["miss_lat"].append(t_lookup + dt)
        return out

    def _open_cache(self):
        import encache
        return encache.Cache(ec_transfer_config=CONNECTOR_CONFIG,
                             model=self.cfg.spec.name(),
                             revision=self.cfg.revision, dtype=self.cfg.dtype,
                             store=self.cfg.store_url, output="torch",
                             log=self._log)

    def _run_cached(self, rep, cache):
        """The requests with the cache, until every publication is
        written; its counters into rep.  Each request's lookup is started
        (lookup(wait=False)) before the previous request's misses are
        encoded, so the Store's reads overlap the encoding (docs/python.md,
        "Lookups that do not wait"); its outputs are published once all
        are encoded (a publication waits for a lookup running)."""
        import encache
        shape = (self.cfg.spec.tokens, self.cfg.spec.hidden)
        published = set()

        def start(picks):
            items = [encache.Item(id=self.cfg.images[p][0], dtype=self.dtype,
                                  shape=shape) for p in picks]
            step = cache.step()
            step.lookup(items, wait=False)
            return picks, step

        stream = request_stream(self.cfg, self.index)
        following = next(stream, None)
        following = start(following) if following is not None else None
        while following is not None:
            picks, step = following
            with step:
                t0 = time.perf_counter()
                step.wait()
                t_lookup = time.perf_counter() - t0  # what it still waited
                rep["store_wait_s"] += t_lookup
                following = next(stream, None)
                if following is not None:
                    following = start(following)
                outs = []
                for pick, r in zip(picks, step.results):
                    rep["outcome"][r.outcome.name.lower()] += 1
                    if r.hit:
                        self._on_hit(rep, pick, r.tensor, t_lookup,
                                     r.id in published)
                        continue
                    outs.append((r.id, self._encode(rep, pick, t_lookup)))
                for id_, out in outs:
                    if step.publish(id_, out) == encache.Skip.QUEUED:
                        published.add(id_)
            self._request_done(rep)
        cache.flush()
        self._stats(rep, cache.stats())

    def _on_hit(self, rep, pick, tensor, t_lookup, own):
        rep["images"] += 1
        rep["hits"] += 1
        rep["hits_own" if own else "hits_other"] += 1
        rep["hit_lat"].append(t_lookup)
        mode = self.cfg.verify
        if mode == "all" or (mode == "sample" and rep["hits"] % 8 == 1):
            tk = time.perf_counter()
            self._keep(pick, tensor)
            rep["kept_s"] += time.perf_counter() - tk

    def _keep(self, pick, tensor):
        """Keeps a hit for verification: one copy of each distinct content
        per image (bit for bit), with the number of hits that had it."""
        reps = self.kept.setdefault(pick, [])
        bits = bit_view(tensor)
        for entry in reps:
            if self.torch.equal(bit_view(entry[0]), bits):
                entry[1] += 1
                return
        reps.append([tensor, 1])

    @staticmethod
    def _stats(rep, st):
        for k in ("bytes_read", "published_written", "published_present",
                  "published_failed", "poisoned"):
            rep[k] = getattr(st, k)
        rep["published_skipped"] = {str(k).lower(): v for k, v in
                                    dict(st.published_skipped).items() if v}

    def _check(self, pick, fresh):
        """The hits kept for image pick against fresh, its fresh encode."""
        v = self.verified
        expected = bit_view(fresh)
        v["fresh_encodes"] += 1
        for tensor, count in self.kept.pop(pick):
            v["checked"] += count
            if not self.torch.equal(bit_view(tensor), expected):
                v["failed"] += count
                v["failures"].append(
                    "encoder %d: VERIFICATION FAILED: %d hit(s) of %s (id %s)"
                    " differ from a fresh encode"
                    % ((self.index, count) + self.cfg.images[pick][::-2]))

    def verify(self):
        """Checks the hits kept that no encode of the baseline has checked
        (after a baseline, none); the counts of every check since the last
        call."""
        for pick in sorted(self.kept):
            self._check(pick, self.encoder.encode(self.cfg.images[pick][1]))
        v, self.verified = self.verified, new_verified()
        return v

    def _log(self, msg):
        sys.stderr.write("encache demo: encoder %d: %s\n" % (self.index, msg))


def _serve(worker, conn):
    while True:
        try:
            cmd = conn.recv()
        except EOFError:  # the parent is gone
            return
        if cmd[0] == "run":
            conn.send(("report", worker.run(cmd[1])))
        elif cmd[0] == "verify":
            conn.send(("verified", worker.verify()))
        else:
            return


def worker_main(cfg, index, conn, done):
    """The encoder process's entry point."""
    try:
        worker = Worker(cfg, index, done)
        conn.send(("ready", os.getpid()))
        _serve(worker, conn)
    except KeyboardInterrupt:  # the parent says so
        sys.exit(1)
    except Exception as e:  # reported to the parent, which stops the demo
        why = "%s: %s" % (type(e).__name__, e)
        if not hasattr(e, "code"):  # not one of encache's: show where
            why += "\n" + traceback.format_exc(limit=-3)
        try:
            conn.send(("error", why))
        except OSError:
            pass
        sys.exit(1)
