# SPDX-License-Identifier: Apache-2.0
"""The summary of ``python3 -m encache.demo``: the table of the C tool's
``encache demo`` (same rows, same figures), as text or as JSON."""
import json

from ._demo_worker import OUTCOMES

HEADER_BYTES = 24  # an object's header (docs/format.md), before the payload
SUMMED = ("requests", "images", "hits", "hits_own", "hits_other", "encodes",
          "encode_s", "store_wait_s", "bytes_read", "published_written", "published_present",
          "published_failed", "checked", "failed", "fresh_encodes")


def total(reports):
    """The encoders' reports summed into one (latencies concatenated)."""
    t = {k: sum(r.get(k, 0) for r in reports) for k in SUMMED}
    t["outcome"] = {k: sum(r["outcome"][k] for r in reports) for k in OUTCOMES}
    t["hit_lat"] = sorted(x for r in reports for x in r["hit_lat"])
    t["miss_lat"] = sorted(x for r in reports for x in r["miss_lat"])
    t["busy_s"] = max(r["busy_s"] for r in reports)
    t["poisoned"] = any(r.get("poisoned") for r in reports)
    skipped = {}
    for r in reports:
        for k, v in r.get("published_skipped", {}).items():
            skipped[k] = skipped.get(k, 0) + v
    t["published_skipped"] = skipped
    t["failures"] = [f for r in reports for f in r.get("failures", [])]
    return t


def pct(sorted_values, p):
    """The C tool's percentile: the value at index n * p / 100."""
    n = len(sorted_values)
    return sorted_values[min(n * p // 100, n - 1)] if n else 0.0


def figures(c, b):
    """The derived figures of the cached run c and the baseline b."""
    thr = c["images"] / c["busy_s"] if c["busy_s"] > 0 else 0.0
    bthr = b["images"] / b["busy_s"] if b["busy_s"] > 0 else 0.0
    return {"thr": thr, "bthr": bthr,
            "speedup": thr / bthr if bthr > 0 else 0.0,
            "saved": b["encode_s"] - c["encode_s"],
            "hp50": pct(c["hit_lat"], 50) * 1e3,
            "hp99": pct(c["hit_lat"], 99) * 1e3,
            "mp50": pct(c["miss_lat"], 50) * 1e3,
            "mp99": pct(c["miss_lat"], 99) * 1e3,
            "skipped": sum(c["published_skipped"].values())
            + c["published_failed"],
            "passed": c["failed"] == 0 and not c["poisoned"]}


def human_bytes(n):
    if n >= 1 << 30:
        return "%.2f GiB" % (n / (1 << 30))
    if n >= 1 << 20:
        return "%.1f MiB" % (n / (1 << 20))
    return "%.1f KiB" % (n / 1024)


def _row(label, value, base=""):
    return "%-30s %16s %s" % (label, value, base)


def _repeats(c):
    """Encodes avoided that are not hits: repeats within one request."""
    return max(0, c["images"] - c["encodes"] - c["hits_other"] - c["hits_own"])


def _table(c, b, f, out_bytes):
    avoided = c["images"] - c["encodes"]
    share = 100.0 * avoided / c["images"] if c["images"] else 0.0
    rows = ["%-30s %16s %20s" % ("", "with encache", "without (baseline)"),
            _row("requests", c["requests"], "%20d" % b["requests"]),
            _row("images", c["images"], "%20d" % b["images"]),
            _row("encoder runs", c["encodes"], "%20d" % b["encodes"]),
            "%-30s %9d (%4.1f%%)" % ("encodes avoided", avoided, share),
            _row("  hits from other encoders", c["hits_other"]),
            _row("  hits of own publications", c["hits_own"]),
            # The three add up to encodes avoided: an image repeated within
            # one request is encoded (or found) once for all its copies.
            _row("  repeats within a request", _repeats(c)),
            _row("misses by reason", "")]
    rows += ["  %-28s %16d" % (k, c["outcome"][k]) for k in OUTCOMES[1:]]
    rows += [_row("encoder time", "%.2fs" % c["encode_s"],
                  "%19.2fs" % b["encode_s"]),
             _row("encoder time saved", "%.2fs" % f["saved"]),
             _row("throughput (images/s)", "%.1f" % f["thr"],
                  "%20.1f" % f["bthr"]),
             _row("speed-up", "%.2fx" % f["speedup"]),
             "%-30s %9.3f / %.3f ms" % ("hit latency p50 / p99", f["hp50"],
                                         f["hp99"]),
             "%-30s %9.3f / %.3f ms" % ("miss latency p50 / p99", f["mp50"],
                                         f["mp99"]),
             _row("store time steps waited", "%.3fs" % c["store_wait_s"],
                  " (%.3f ms a request; lookups started ahead, overlapping"
                  " encodes)" % (c["store_wait_s"] * 1e3
                                 / max(c["requests"], 1))),
             _row("bytes read", human_bytes(c["bytes_read"])),
             _row("bytes published", human_bytes(
                 c["published_written"] * (out_bytes + HEADER_BYTES)),
                 " (%d objects; %d already present)"
                 % (c["published_written"], c["published_present"]))]
    skipped = _row("publications skipped", f["skipped"]).rstrip()
    for k, v in sorted(c["published_skipped"].items()):
        skipped += "  %s: %d" % (k, v)
    if c["published_failed"]:
        skipped += "  store failed: %d" % c["published_failed"]
    rows.append(skipped)
    rows.append("%-30s %s (%d hits checked bit for bit against a fresh "
                "encode)" % ("verification", "passed" if f["passed"]
                             else "FAILED", c["checked"]))
    return rows


def _verification_said(mode, fresh):
    if mode == "none":
        return "none (--verify none)"
    return ("%s, each against the same encoder's fresh encode of its image in "
            "the run without encache (%d images; checks not timed)"
            % ("every hit" if mode == "all" else "every 8th hit", fresh))


def text(run, c, b):
    """The summary as text lines; run describes the run (see demo.py)."""
    f = figures(c, b)
    spec = run["spec"]
    head = ["",
            "encache demo (Python): %d encoders sharing %s"
            % (run["encoders"], run["store_shown"]),
            "encoder: " + spec.describe(),
            "images: " + run["images_said"],
            "workload: %d requests per encoder, 1-4 images each from %d images"
            " (Zipf s=%g), %d tokens x %d hidden, %s"
            % (run["requests"], run["n_images"], run["skew"], spec.tokens,
               spec.hidden, run["dtype"]),
            "processes: %d encoders started with multiprocessing \"%s\", "
            "torch.set_num_threads(1), batch 1" % (run["encoders"],
                                                   run["context"]),
            "verification: " + _verification_said(run["verify"],
                                                  c["fresh_encodes"]),
            ""]
    return head + _table(c, b, f, run["out_bytes"])


def as_json(run, c, b):
    """The summary as a JSON document (the C tool's keys, and a few more)."""
    f = figures(c, b)
    spec = run["spec"]
    doc = {
        "store": run["store_shown"],
        "encoder": spec.as_dict(),
        "image_set": run["images_said"],
        "processes": {"context": run["context"], "threads_per_encoder": 1},
        "workload": {"encoders": run["encoders"],
                     "requests_per_encoder": run["requests"],
                     "images": run["n_images"], "tokens": spec.tokens,
                     "hidden": spec.hidden, "dtype": run["dtype"],
                     "skew": run["skew"], "seed": run["seed"]},
        "requests": c["requests"], "images": c["images"],
        "hits": {"total": c["hits"],
                 "published_by_other_encoders": c["hits_other"],
                 "published_by_same_encoder": c["hits_own"]},
        "misses": {k: c["outcome"][k] for k in OUTCOMES[1:]},
        "encodes": c["encodes"],
        "encodes_avoided": c["images"] - c["encodes"],
        "repeats_within_a_request": _repeats(c),
        "encoder_seconds": round(c["encode_s"], 3),
        "baseline_encoder_seconds": round(b["encode_s"], 3),
        "encoder_seconds_saved": round(f["saved"], 3),
        "throughput_images_per_s": round(f["thr"], 1),
        "baseline_throughput_images_per_s": round(f["bthr"], 1),
        "speedup": round(f["speedup"], 2),
        "hit_latency_ms": {"p50": round(f["hp50"], 3),
                           "p99": round(f["hp99"], 3)},
        "miss_latency_ms": {"p50": round(f["mp50"], 3),
                            "p99": round(f["mp99"], 3)},
        "store_wait_seconds": round(c["store_wait_s"], 6),
        "bytes_read": c["bytes_read"],
        "publications": {"written": c["published_written"],
                         "already_present": c["published_present"],
                         "failed": c["published_failed"],
                         "skipped": c["published_skipped"]},
        "verification": {"mode": run["verify"], "checked": c["checked"],
                         "failed": c["failed"],
                         "fresh_encodes": c["fresh_encodes"],
                         "passed": f["passed"]},
    }
    return json.dumps(doc, indent=2)
