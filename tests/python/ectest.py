# SPDX-License-Identifier: Apache-2.0
"""Helpers of the Python suite (tests/python): unique names, the vLLM
configuration that turns reuse on, sample tensors and their raw bits,
one-item lookups and publications, the fault-injecting Store
(tests/python/fault_store.c, loaded with ctypes), a redis-server of a
test's own, and the C tool (tools/encache)."""
import ctypes
import itertools
import json
import multiprocessing
import multiprocessing.connection
import os
import select
import socket
import subprocess
import threading
import time
import weakref

import numpy as np
import pytest
import torch

import encache

_serial = itertools.count()
F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16
DTYPES = (F32, F16, BF16)
# The integer type of the same width, to compare raw bits.
INT_OF = {F32: torch.int32, F16: torch.int16, BF16: torch.int16}
# What numpy output gives for each dtype (bfloat16: raw bits as uint16).
NUMPY_OF = {F32: np.float32, F16: np.float16, BF16: np.uint16}
TIMEOUT = 60  # seconds: the bound of every wait on another process


def unique(tag):
    """A name no other test, run or process uses."""
    return f"ecpy-{tag}-{os.getpid()}-{next(_serial)}"


def config(**extra):
    """A vLLM ec_transfer_config with reuse on and the extra options of
    ec_connector_extra_config."""
    return {"ec_connector": "ECMooncakeConnector",
            "ec_role": "ec_producer",
            "ec_connector_extra_config": {"cross_encoder_cache": True,
                                          **extra}}


def sample(rows, cols, dtype=F32, seed=0):
    """A rows x cols tensor with values that make bit-exactness matter:
    NaN, -0.0 and infinities in its first row, random values elsewhere."""
    g = torch.Generator().manual_seed(seed)
    t = torch.randn(rows, cols, generator=g)
    specials = [float("nan"), -0.0, float("inf"), float("-inf")]
    for j, v in enumerate(specials[:cols]):
        t[0, j] = v
    return t.to(dtype)


def owned_tensor(rows, cols, seed=0):
    """A sample tensor over a numpy array of its own, a finalizer that fires
    when that memory is freed, and the list of the threads it fired on."""
    arr = sample(rows, cols, seed=seed).numpy().copy()
    freed = []
    fin = weakref.finalize(arr, lambda: freed.append(threading.get_ident()))
    return torch.from_numpy(arr), fin, freed


def raw(x):
    """The raw bits of a tensor or array, as a numpy array of unsigned
    integers of the element's width."""
    if isinstance(x, torch.Tensor):
        x = x.contiguous().view(INT_OF[x.dtype]).numpy()
    return x.view(np.uint32 if x.itemsize == 4 else np.uint16)


def same_bits(a, b):
    return tuple(a.shape) == tuple(b.shape) and np.array_equal(raw(a), raw(b))


def torch_bits_equal(a, b):
    """torch.equal on the integer views of two tensors of one dtype."""
    return a.dtype == b.dtype and torch.equal(a.view(INT_OF[a.dtype]),
                                              b.view(INT_OF[b.dtype]))


def lookup_one(cache, id_, dtype, shape, device=None):
    """The Result of looking one item up in a step of its own."""
    kw = {} if device is None else {"device": device}
    with cache.lookup([encache.Item(id=id_, dtype=dtype, shape=shape,
                                    **kw)]) as step:
        assert len(step.results) == 1
        return step.results[0]


def publish_one(cache, id_, t, flush=True):
    """Looks id_ up (it must be a MISS), publishes t for it (it must be
    queued) and, with flush, waits for the write."""
    with cache.lookup([(id_, t.dtype, tuple(t.shape))]) as step:
        r = step.results[0]
        assert r.outcome == encache.Outcome.MISS, (r.outcome, r.why)
        assert step.publish(id_, t) == encache.Skip.QUEUED
    if flush:
        cache.flush()


def open_cache(url, model="org/vit", dtype=F32, **kw):
    if "options" not in kw:
        kw.setdefault("ec_transfer_config", config())
    return encache.Cache(model=model, dtype=dtype, store=url, **kw)


def shm_of(url):
    """The shm URL of the segment a pyfault:// URL wraps."""
    return url.replace("pyfault://", "shm://", 1)


# ------------------------------------------------------------- the tool

def tool(*args, store=None, check=True):
    """Runs the C tool (ENCACHE_TOOL); returns its CompletedProcess with
    stdout as bytes."""
    path = os.environ.get("ENCACHE_TOOL")
    if not path:
        pytest.skip("ENCACHE_TOOL is not set (tests/python/run.sh sets it)")
    argv = [path] + (["--store", store] if store else []) + list(args)
    p = subprocess.run(argv, capture_output=True, timeout=TIMEOUT)
    if check and p.returncode != 0:
        raise AssertionError(f"{argv} exited {p.returncode}: "
                             f"{p.stderr.decode(errors='replace')}")
    return p


def shm_destroy(name):
    """Removes segment NAME (absent already is fine)."""
    path = os.environ.get("ENCACHE_TOOL")
    if path:
        subprocess.run([path, "shm", "destroy", name], capture_output=True,
                       timeout=TIMEOUT)


def mooncake_client_json(directory):
    """Writes a Mooncake client configuration for the stand-in clients
    (no master is reached) into directory; its path."""
    path = os.path.join(str(directory), "mooncake.json")
    with open(path, "w") as f:
        json.dump({
            "local_hostname": "127.0.0.1", "metadata_server": "P2PHANDSHAKE",
            "master_server_address": "127.0.0.1:50051", "protocol": "tcp",
            "mode": "standalone-store", "global_segment_size": 0,
            "local_buffer_size": "64MB"}, f)
    return path


# ------------------------------------------------ fixtures of both suites
# (tests/python and tests/vllm import them into their conftest.py)

@pytest.fixture
def shm():
    """shm(size="16MiB", scheme="shm"): the URL of a fresh segment, named
    for this process and test; every one is destroyed after the test."""
    names = []

    def make(size="16MiB", scheme="shm"):
        name = unique("shm")
        names.append(name)
        return f"{scheme}://{name}?size={size}"

    yield make
    for name in names:
        shm_destroy(name)


@pytest.fixture(name="fault")
def fault_fixture():
    """The fault library, every fault off before and after the test."""
    f = fault()
    f.reset()
    yield f
    f.reset()


# ------------------------------------------- the fault-injecting Store

class Fault:
    """The switches of tests/python/fault_store.c: Stores opened as
    pyfault://NAME?size=SIZE are shm://NAME?size=SIZE with faults."""
    READS, WRITES = 0, 1

    def __init__(self, path):
        self.lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        assert self.lib.pyfault_register() == 0
        self.UNCONFIRMED = self.lib.pyfault_code_unconfirmed()
        self.UNAVAILABLE = self.lib.pyfault_code_unavailable()

    def answer(self, which, rc):
        """Operations of kind `which` answer rc (0: forwarded again)."""
        self.lib.pyfault_set_rc(which, rc)

    def hold(self, which, on=True):
        self.lib.pyfault_hold(which, 1 if on else 0)

    def wait_held(self, which, n=1, ms=10000):
        return self.lib.pyfault_wait_held(which, n, ms) == 0

    def wait_finished(self, which, n=1, ms=10000):
        return self.lib.pyfault_wait_finished(which, n, ms) == 0

    def calls(self, which):
        return self.lib.pyfault_count(which, 0)

    def timed_out(self, which):
        return self.lib.pyfault_count(which, 2)

    def reset(self):
        self.lib.pyfault_reset()


_fault = None


def fault():
    """The loaded fault library (skips the test when it was not built)."""
    global _fault
    if _fault is None:
        path = os.environ.get("ENCACHE_PYFAULT_LIB")
        if not path or not os.path.exists(path):
            pytest.skip("ENCACHE_PYFAULT_LIB is not set (tests/python/run.sh "
                        "sets it to the encache_pyfault library)")
        _fault = Fault(path)
    return _fault


def reset_fault():
    if _fault is not None:
        _fault.reset()


# ------------------------------------------------- a redis-server of our own

def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """A redis-server on a free loopback port, started in the foreground
    so that the test can kill it; ready once it logs that it accepts
    connections."""

    def __init__(self, workdir):
        for _ in range(5):
            self.port = _free_port()
            self.proc = subprocess.Popen(
                ["redis-server", "--port", str(self.port), "--bind",
                 "127.0.0.1", "--save", "", "--appendonly", "no", "--dir",
                 str(workdir), "--logfile", ""],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                env={k: v for k, v in os.environ.items()
                     if k != "LD_PRELOAD"})  # a sanitizer build's runtimes
            if self._ready():
                self.url = f"redis://127.0.0.1:{self.port}"
                return
            self.kill()
        raise AssertionError("redis-server would not start on 5 ports")

    def _ready(self):
        deadline = time.monotonic() + 10
        out = self.proc.stdout
        while time.monotonic() < deadline:
            ready, _, _ = select.select([out], [], [], 1.0)
            if not ready:
                continue
            line = out.readline()
            if not line:  # exited: the port was taken after all
                return False
            if b"Ready to accept connections" in line:
                return True
        return False

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(TIMEOUT)
        self.proc.stdout.close()


# ---------------------------------------------------------- other processes

def run_child(ctx, target, *args):
    """Runs target(*args, conn) in a process of multiprocessing context
    ctx; returns what it sent on conn (bounded; a child that dies or
    hangs fails the test)."""
    ours, theirs = ctx.Pipe(duplex=False)
    p = ctx.Process(target=target, args=args + (theirs,))
    p.start()
    theirs.close()
    try:
        ready = multiprocessing.connection.wait([ours, p.sentinel], TIMEOUT)
        if ours in ready and ours.poll():
            return ours.recv()
        raise AssertionError(f"the child sent nothing (exit code "
                             f"{p.exitcode})")
    finally:
        p.join(TIMEOUT)
        if p.is_alive():
            p.kill()
            p.join(TIMEOUT)
        assert p.exitcode == 0, p.exitcode


def child_round_trip(url, mine, mine_bits, theirs, their_arr, conn):
    """In a child: its own Cache hits `mine` (published by the parent, raw
    bits mine_bits) and publishes `theirs` (their_arr, float32)."""
    torch.set_num_threads(1)
    try:
        with open_cache(url) as c:
            r = lookup_one(c, mine, F32, mine_bits.shape)
            if not (r.hit and np.array_equal(raw(r.tensor), mine_bits)):
                conn.send(f"not a hit: {r.outcome!r} {r.why}")
                return
            publish_one(c, theirs, torch.from_numpy(their_arr))
        conn.send("ok")
    except Exception as e:
        conn.send(repr(e))


def child_uses_parent(cache, step, url, conn):
    """In a forked child: every use of the parent's Cache and Step raises
    ForkError; a Cache of the child's own works."""
    out = []
    for call in (lambda: cache.lookup([("p", F32, (2, 2))]), cache.step,
                 cache.flush, lambda: step.publish("q", sample(2, 2)),
                 lambda: step.lookup([("p", F32, (2, 2))])):
        try:
            call()
            out.append("no error")
        except encache.ForkError:
            out.append("ForkError")
        except Exception as e:
            out.append(repr(e))
    try:
        with open_cache(url) as own:
            out.append("hit" if lookup_one(own, "p", F32, (2, 2)).hit
                       else "no hit")
    except Exception as e:
        out.append(repr(e))
    conn.send(out)
