# SPDX-License-Identifier: Apache-2.0
"""python3 -m encache.demo: encoder processes that share one Store, each
encoding real images with a torchvision VisionTransformer.

Each encoder serves requests of 1 to 4 images drawn with a Zipf popularity,
identifies each image by a hash of its decoded pixels, looks the request up
in the cache, encodes the misses (batch 1), publishes them, and keeps its
hits to check them bit for bit against a fresh encode.  Then the same
requests are served without encache, and a summary compares the two runs
with the rows of the C tool's ``encache demo``.
"""
import argparse
import os
import sys
import time

from . import _demo_images, _demo_report
from ._demo_fleet import CONTEXT, Fleet, FleetError
from ._demo_model import ModelSpec, check_spec
from ._demo_worker import CONNECTOR_CONFIG, WorkerConfig

DESCRIPTION = """\
Runs ENCODERS encoder processes that share one encache Store.  Each encodes
real images with a torchvision VisionTransformer whose weights are
initialised from a fixed seed (nothing is downloaded: it is a real vision
transformer computing real embeddings, but not a trained one).  An image's
embedding is the encoder's output token matrix: one row a token (the class
token, then one a patch), one column a hidden unit, float32 unless --dtype
says otherwise.

Each encoder (one thread, batch 1, so the same image always gives the same
bits) serves REQUESTS requests of 1 to 4 images drawn with a Zipf
popularity from the image set (seeded per encoder), identifies every image
by a sha256 of its decoded pixels, looks the request up, encodes the misses
and publishes them, and keeps its hits.  Then the same requests are served
without encache, every image encoded afresh, each kept hit is checked bit
for bit against the fresh encode of its image, and a summary compares the
two runs.

Without --store, a private shared-memory Store (shm://encache-pydemo-PID)
is made for the run and destroyed at its end.  The defaults take about a
minute on two cores, both runs together."""

EPILOG = """\
The summary has the rows of the C tool's `encache demo`.  Encoder time is
the time spent encoding (summed over the encoders); throughput is the
images served over the busy time of the slowest encoder (from its first
request to its last publication written, less the time spent keeping and
checking hits for verification).  Each encoder starts a request's lookup
(lookup(wait=False)) before it encodes the previous request's misses; hit
latency is the time the hit's request still waited for its lookup, and
"store time steps waited" their sum; miss latency is that wait plus the
encode.  The encoders start, import
torch and build the model before anything is timed.

Exit status: 0 when both runs completed and verification passed; 1 when
verification failed, an encoder failed or the Store cannot be used; 2 on
bad usage."""


# The options: (flag, type, default, metavar or choices, help).
OPTIONS = [
    ("--encoders", int, 2, "N", "encoder processes (default 2, at most 32; "
     "each holds its own torch and model, about 300 MiB)"),
    ("--requests", int, 50, "N",
     "requests per encoder, each of 1 to 4 images (default 50)"),
    ("--images", str, "24", "N|DIR",
     "N distinct images derived from the repository's test images "
     "(tests/data/images) by flips, rotations, crops and colour shifts "
     "(default 24), or the PNG/JPEG files of DIR (files that do not decode "
     "are skipped with a message)"),
    ("--skew", float, 1.1, "S",
     "Zipf exponent of the images' popularity (default 1.1)"),
    ("--seed", int, 1, "N", "seed of the request streams (default 1); the "
     "model's weights always come from seed 0"),
    ("--dtype", str, "float32", ("float32", "float16", "bfloat16"),
     "dtype of the embeddings (the model computes in float32 and its output "
     "is cast; default float32)"),
    ("--verify", str, "all", ("all", "sample", "none"),
     "hits to check bit for bit against a fresh encode: all (default), "
     "sample (every 8th) or none; the checks are not timed"),
    ("--store", str, None, "URL",
     "the Store to share (e.g. redis://host:6379, shm://NAME?size=1GiB; "
     "default: a private shm segment, destroyed at the end).  The run writes "
     "under a namespace of its own, which it cannot remove from a Store it "
     "did not make"),
    ("--model-layers", int, 2, "N", "transformer layers (default 2)"),
    ("--model-hidden", int, 384, "N", "hidden size, a multiple of 64; heads "
     "= hidden / 64, MLP = 4 x hidden (default 384)"),
    ("--patch", int, 32, "N", "patch side in pixels of the 224 x 224 input; "
     "tokens = (224 / patch)^2 + 1 (default 32: 50 tokens)"),
]


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="python3 -m encache.demo", description=DESCRIPTION, epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    for flag, kind, default, meta, text in OPTIONS:
        if isinstance(meta, tuple):
            p.add_argument(flag, type=kind, default=default, choices=meta,
                           help=text)
        else:
            p.add_argument(flag, type=kind, default=default, metavar=meta,
                           help=text)
    p.add_argument("--json", action="store_true",
                   help="print the summary as JSON")
    args = p.parse_args(argv)
    if not 1 <= args.encoders <= 32:
        p.error("--encoders: must be from 1 to 32")
    if not 1 <= args.requests <= 10000000:
        p.error("--requests: must be from 1 to 10000000")
    if not 0 <= args.skew <= 10:
        p.error("--skew: must be from 0 to 10")
    if args.seed < 0:
        p.error("--seed: must not be negative")
    args.spec = ModelSpec(args.model_layers, args.model_hidden, args.patch)
    why = check_spec(args.spec)
    if why:
        p.error(why)
    return p, args


def say(msg):
    sys.stderr.write("encache demo: %s\n" % msg)
    sys.stderr.flush()


def url_shown(url):
    """url without its password, as the library shows URLs."""
    import encache
    return encache.url_redact(url)


def out_bytes(args):
    """The bytes of one embedding."""
    itemsize = 4 if args.dtype == "float32" else 2
    return args.spec.tokens * args.spec.hidden * itemsize


def own_store(args, n_images):
    """A private shm segment's (url, name), sized for every output twice
    over, as the C tool sizes its own."""
    size = (out_bytes(args) + 4096) * n_images * 2 + (16 << 20)
    name = "encache-pydemo-%d" % os.getpid()
    return "shm://%s?size=%d" % (name, size), name


def destroy_shm(name):
    """Removes the shm segment of shm://name, if it is there."""
    import encache
    encache.shm_destroy(name)


def probe_store(url, args, revision):
    """Opens a Cache on url and looks one item up: (0, the run's key
    namespace) when the Store answers, else (exit status, why not): 2 for a
    malformed URL."""
    import encache
    try:
        with encache.Cache(ec_transfer_config=CONNECTOR_CONFIG,
                           model=args.spec.name(), revision=revision,
                           dtype=args.dtype, store=url,
                           output="buffer") as cache:
            with cache.lookup([("encache-pydemo-probe", args.dtype,
                                (1, 1))]) as step:
                r = step.results[0]
                if r.outcome in (encache.Outcome.UNAVAILABLE,
                                 encache.Outcome.SKIPPED):
                    return 1, r.why or r.outcome.name
            return 0, cache.namespace
    except encache.UrlError as e:
        return 2, str(e)
    except encache.Error as e:
        return 1, "%s: %s" % (type(e).__name__, e)


def run_fleet(fleet, args, cfg):
    """Both runs with one fleet: (cached reports, baseline reports); the
    hits of the first are verified against the encodes of the second."""
    fleet.wait_ready()
    total = args.encoders * args.requests
    cached = fleet.command(("run", True), "report", "with encache", total)
    base = fleet.command(("run", False), "report", "baseline (no cache)",
                         total)
    checks = fleet.command(("verify",), "verified")
    for r, v in zip(cached, checks):
        r.update(v)
    return cached, base


def describe_run(args, cfg, images_said, url):
    return {"spec": args.spec, "encoders": args.encoders,
            "requests": args.requests, "n_images": len(cfg.images),
            "images_said": images_said, "skew": args.skew, "seed": args.seed,
            "dtype": args.dtype, "verify": args.verify, "context": CONTEXT,
            "store_shown": url_shown(url),
            "out_bytes": out_bytes(args)}


def report(args, run, cached, base):
    """Prints the summary; returns the exit status."""
    c, b = _demo_report.total(cached), _demo_report.total(base)
    for line in c["failures"]:
        say(line)
    if args.json:
        print(_demo_report.as_json(run, c, b))
    else:
        print("\n".join(x.rstrip() for x in _demo_report.text(run, c, b)))
    sys.stdout.flush()
    if not _demo_report.figures(c, b)["passed"]:
        say("VERIFICATION FAILED: %s" % (
            "the cache was poisoned" if c["poisoned"] else
            "a hit differed from a fresh encode (see above)"))
        return 1
    return 0


def remove_run_objects(url, namespace):
    """Removes the run's objects (its own namespace) from a Store it was
    given, as `encache demo` does; says so when the Store cannot."""
    import encache
    try:
        removed, _ = encache.purge(url, namespace)
        say("removed the run's %d objects from %s" % (removed, url_shown(url)))
    except encache.Error as e:
        say("the run's objects stay in %s: %s" % (url_shown(url), e))


def run(parser, args, cfg, shm_name):
    """Starts the encoders, probes the Store, runs the fleet, removes the
    private Store: the reports of both runs, or an exit status."""
    url = cfg.store_url
    fleet = Fleet(cfg, args.encoders)  # they import torch meanwhile
    try:
        status, said = probe_store(url, args, cfg.revision)
        if status == 2:
            parser.error("--store: %s" % said)
        if status:
            say("cannot use the Store %s: %s" % (url_shown(url), said))
            return 1
        try:
            return run_fleet(fleet, args, cfg)
        finally:
            if not shm_name:
                remove_run_objects(url, said)
    except FleetError as e:
        say(str(e).rstrip())
        say("the demo stopped")
        return 1
    finally:
        fleet.close()
        if shm_name:
            destroy_shm(shm_name)


def main(argv=None):
    parser, args = parse_args(argv)
    preprocessing = "resize %d bilinear" % args.spec.image_size
    images, said = _demo_images.make_images(args.images, preprocessing, say)
    if images is None:
        parser.error(said)
    url, shm_name = args.store, None
    if url is None:
        url, shm_name = own_store(args, len(images))
        destroy_shm(shm_name)
    revision = "run-%d-%d" % (os.getpid(), int(time.time()))
    cfg = WorkerConfig(args.spec, args.dtype, url, revision, args.requests,
                       args.skew, args.seed, args.verify,
                       tuple((im.id, im.pixels, im.name) for im in images))
    reports = run(parser, args, cfg, shm_name)
    if isinstance(reports, int):
        return reports
    return report(args, describe_run(args, cfg, said, url), *reports)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        say("interrupted")
        sys.exit(130)
