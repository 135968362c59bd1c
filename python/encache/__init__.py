# SPDX-License-Identifier: Apache-2.0
"""encache: reuse of vision encoders' outputs through a shared Store.

Before encoding, an encoder asks the Cache for the inputs whose embeddings
are already in the Store; the hits come back as tensors the library filled
in place, the misses with the reason; the encoder encodes the misses and
publishes their outputs, which the library writes in the background with
no copy.  Keys and objects are byte compatible with vLLM's cross-encoder
output reuse (protocol:v3).  See docs/python.md.

    import encache, torch
    with encache.Cache(ec_transfer_config=cfg, model="org/vit",
                       dtype=torch.bfloat16) as cache:
        with cache.lookup([encache.Item(h, torch.bfloat16, (rows, cols))
                           for h in hashes]) as step:
            for r in step:
                if not r.hit:
                    step.publish(r.id, encode(r.id))

The package needs only the standard library; torch and NumPy are used when
present.
"""

import dataclasses
import enum
import importlib.util
import json
import logging
import typing

try:
    from . import _encache
except ImportError as _e:  # name the cause, not "a circular import"
    import glob as _glob
    import os as _os
    import sys as _sys
    _here = _os.path.dirname(_os.path.abspath(__file__))
    if _glob.glob(_os.path.join(_here, "_encache*.so")):
        raise  # built, but it cannot load: Python's own message says why
    raise ImportError(
        f"encache: there is no compiled extension encache._encache in "
        f"{_here}. Either this is the repository's python/ source "
        "directory (run Python from another directory: the built package "
        "is in build/python, the installed one under /usr/local), or "
        "encache was not built and installed for this interpreter "
        f"({_sys.executable}): `sh scripts/install.sh` installs it for "
        "Debian's /usr/bin/python3, which pyenv, conda and virtual "
        "environments do not use (docs/python.md)") from None
from . import _mooncake, _tensors
from ._keys import vllm_encoder_hash
from ._errors import (ClosedError, ConfigError, Error, ForkError,
                      FormatError, InvalidError, JsonError, LibraryError,
                      OutOfMemoryError, PoisonedError, StepsError, StoreError,
                      UrlError, by_code)

__version__ = _encache.VERSION

Outcome = enum.IntEnum("Outcome", [(n, i) for i, n in
                                   enumerate(_encache.OUTCOMES)])
Outcome.__doc__ = """A lookup's outcome for one item: HIT (loaded; do not
encode), MISS, INCOMPATIBLE, OVERSIZE, UNAVAILABLE, SKIPPED, IN_FLIGHT
(encode)."""

class _Skip(enum.IntEnum):
    """The base of Skip: truthy success.  The values stay the C library's
    (QUEUED is 0, a reason its ENCACHE_SKIP_* code), so that
    `publish(...) == Skip.QUEUED` and `== 0` hold as before; only truth
    changes: QUEUED is true and every skip reason false, so that
    `if step.publish(id, t):` reads "if it was queued"."""

    def __bool__(self):
        return self.value == 0


Skip = _Skip("Skip", [("QUEUED", 0)] +
             [(name, value) for name, value, _ in _encache.SKIPS])
Skip.__doc__ = """What publish() did: QUEUED (true), or why the output was
skipped (NOT_CANDIDATE, NOT_MATRIX, NOT_CONTIGUOUS, DTYPE, PENDING,
OVER_ITEMS, OVER_BYTES, ...; all false).  Compare with Skip.QUEUED or test
its truth; each skip is counted in Cache.stats().published_skipped and the
first of each reason logged."""

# (event loop, descriptor) of the steps wait_async() waits for now.
_awaited: typing.Set[typing.Tuple[typing.Any, int]] = set()


class Step(_encache.Step):
    """A step: the items of one encoder step, their results and their
    publications (Cache.lookup() and Cache.step() make them).

    A lookup started with ``wait=False`` is pending until it is collected:
    ``wait()`` (blocking, bounded or a poll), ``await step`` /
    ``await step.wait_async()`` in asyncio, or implicitly by ``results``,
    ``hits``, ``misses``, ``len()``, iteration and ``publish()``, which
    wait for it first.  See docs/python.md, "lookup and Step"."""

    __slots__ = ()

    def __new__(cls, *args: typing.Any, **kw: typing.Any) -> "Step":
        raise TypeError("a Step comes from Cache.lookup() or Cache.step()")

    async def wait_async(self) -> "Step":
        """Completes the pending lookup without blocking the running event
        loop: waits for the step's descriptor (loop.add_reader), then
        collects the results (wait(0)).  Raises what wait() raises, and
        InvalidError when another coroutine awaits the step already (one
        at a time); returns the step.  Do not close the step while it is
        awaited."""
        import asyncio
        loop = asyncio.get_running_loop()
        while not self.wait(0):
            fd = self.fileno()
            key = (loop, fd)
            if key in _awaited:
                raise InvalidError("the step is awaited by another coroutine "
                                   "already: one at a time")
            ready = loop.create_future()

            def wake(ready: "asyncio.Future" = ready) -> None:
                loop.remove_reader(fd)  # before the future resolves
                if not ready.done():
                    ready.set_result(None)

            _awaited.add(key)
            loop.add_reader(fd, wake)
            try:
                await ready
            finally:
                loop.remove_reader(fd)  # cancelled: no reader left behind
                _awaited.discard(key)
        return self

    def __await__(self) -> typing.Generator[typing.Any, None, "Step"]:
        return self.wait_async().__await__()


Result = _encache.Result
Buffer = _encache.Buffer
MAX_STEPS = _encache.MAX_STEPS


def shm_destroy(name: str) -> bool:
    """Removes the shared-memory Store segment `name` (as `encache shm
    destroy NAME`); processes attached keep their mapping.  Returns False
    when there is no such segment."""
    return _encache.shm_destroy(name)


def set_block_cache(max_bytes: int) -> int:
    """Sets the most bytes of freed hit memory the package keeps for reuse
    by later lookups (default 64 MiB; 0 keeps none); returns the previous
    value.  See docs/python.md, "Threads, processes and memory"."""
    return _encache.set_block_cache(max_bytes)


def url_redact(url: str) -> str:
    """The Store URL `url` with its password (if any) hidden, as every
    message of the library shows URLs: print Store URLs this way."""
    return _encache.url_redact(url)


def purge(store: str, namespace: str, dry_run: bool = False
          ) -> typing.Tuple[int, typing.Optional[int]]:
    """Removes every object of `namespace` (a Cache's .namespace: the keys
    NAMESPACE "@id:" ...) from the Store at URL `store`, as `encache purge`
    does; nothing outside it.  With dry_run, removes nothing and counts.
    Returns (objects, bytes): bytes only for a dry run (else None).  Raises
    encache.Error when the Store cannot list or remove (Mooncake cannot
    count: a dry run there raises InvalidError)."""
    if not namespace:
        raise InvalidError("purge: give the namespace to remove")
    _mooncake.route(store)
    return _encache.purge(store, namespace + "@id:", bool(dry_run))


def model_identity(model_dir: str,
                   label: typing.Optional[str] = None) -> str:
    """An identity string "LABEL@weights:xxh128:HEX" derived from a digest
    of the weight files under model_dir (as `encache identity`), to give
    as the option embedding_model_identity: new weights under the same
    model name then mean a new namespace (docs/deploy.md, an RL loop).
    label defaults to the directory's name.  Raises encache.Error (with
    the path) when the directory cannot be read or holds no weights."""
    return _encache.model_identity(model_dir, label)


def mooncake_route(store: typing.Optional[str] = None
                   ) -> typing.Optional[str]:
    """The way the Store URL `store` (None: $ENCACHE_STORE) reaches
    Mooncake in this process: "c-abi" (Mooncake's libmooncake_store.so),
    "python" (Mooncake's Python client from pip, through the package's
    C ABI over it) or "none" (neither is installed); None when the URL
    names no Mooncake Store.  Prepares that route for the Stores opened
    next (the environment, once) and says it in the log; a Cache does it
    itself (Cache.mooncake_route).  docs/stores.md."""
    return _mooncake.route(store)


def library_version() -> str:
    """The version of the libencache the package runs on."""
    return _encache.library_version()


class Item(typing.NamedTuple):
    """One input of a lookup: its id (the vLLM mm_hash, or any string that
    identifies the input's content), the output's dtype and shape (rows,
    cols), and the device its output would live on ("cpu")."""
    id: str
    dtype: typing.Any
    shape: typing.Tuple[int, int]
    device: typing.Any = None


@dataclasses.dataclass(frozen=True)
class Stats:
    """A Cache's counters (docs/library.md, encache_stats)."""
    lookups: int
    candidates: int
    hits: int
    misses: int
    incompatible: int
    oversize: int
    unavailable: int
    skipped: int
    bytes_read: int
    batched_reads: int
    published_queued: int
    published_written: int
    published_present: int
    published_failed: int
    published_skipped: typing.Dict[str, int]
    pending_items: int
    pending_bytes: int
    staging_allocations: int
    staging_bytes: int
    steps_open: int
    poisoned: bool
    in_flight: int = 0
    leases_taken: int = 0
    leases_failed: int = 0
    waited: int = 0
    waited_hits: int = 0
    wait_us: int = 0
    device_bytes_copied: int = 0
    device_published: int = 0
    device_pool_bytes: int = 0
    device_pool_full: int = 0
    hits_unchecked: int = 0


_OUTPUTS = {"buffer": 0, "numpy": 1, "torch": 2}
_log = logging.getLogger("encache")


def _default_output():
    for name in ("torch", "numpy"):
        if importlib.util.find_spec(name) is not None:
            return name
    return "buffer"


def _set_outputs(output):
    """Gives the extension the converters that `output` needs."""
    if output == "torch":
        import torch.utils.dlpack
        _encache._set_outputs(torch.utils.dlpack.from_dlpack, None)
    elif output == "numpy":
        import numpy
        _encache._set_outputs(None, numpy.asarray)


class Cache(_encache.Handle):
    """An encoder's handle on a shared Store.

    ec_transfer_config: vLLM's --ec-transfer-config (a dict, or its JSON
        text); or options: typed options by name (docs/configuration.md),
        one of the two.
    model: the model path as given to the encoder (the key namespace);
        revision, encoder_hash: as vLLM's; dtype: the model's dtype.
    store: the Store URL (None: $ENCACHE_STORE, else shm://encache?size=1GiB).
    output: what hits come back as: "torch", "numpy" or "buffer" (None: torch
        if it is installed, else numpy, else buffer).
    log: callable(str) for the library's warnings (default: the "encache"
        logger); it is called on the thread that called the Cache, or on
        the library's lookup thread for a lookup started with wait=False
        (it may not call the Cache there).

    mooncake_route: how the Store reaches Mooncake ("c-abi", "python",
    "none"; None: not a Mooncake Store), see encache.mooncake_route().

    Raises ConfigError (naming the field), JsonError, UrlError, StoreError,
    LibraryError, InvalidError.  A Cache may be shared by threads (its
    calls are serialised); each Step belongs to one thread at a time.
    """

    def __init__(self,
                 ec_transfer_config: typing.Union[str, dict, None] = None, *,
                 model: typing.Optional[str] = None,
                 revision: typing.Optional[str] = None,
                 encoder_hash: typing.Optional[str] = None,
                 dtype: typing.Any = "bfloat16",
                 store: typing.Optional[str] = None,
                 options: typing.Optional[dict] = None,
                 output: typing.Optional[str] = None,
                 log: typing.Optional[typing.Callable[[str], typing.Any]]
                 = _log.warning) -> None:
        if isinstance(ec_transfer_config, dict):
            ec_transfer_config = json.dumps(ec_transfer_config)
        if (ec_transfer_config is None) == (options is None):
            raise InvalidError("give ec_transfer_config or options (one)")
        output = output or _default_output()
        if output not in _OUTPUTS:
            raise InvalidError(
                f"output {output!r} is not 'torch', 'numpy' or 'buffer'")
        _set_outputs(output)
        route = _mooncake.route(store)
        super().__init__(ec_transfer_config, model=model, revision=revision,
                         encoder_hash=encoder_hash,
                         dtype=_tensors.dtype_of(dtype), store=store,
                         options=options, output=_OUTPUTS[output], log=log)
        self.output = output
        self.mooncake_route = route
        if route == "python":
            _mooncake.track(self)

    def stats(self) -> "Stats":
        """The counters now, as a Stats."""
        d = self._stats()
        d["published_skipped"] = {
            Skip(i).name: n for i, n in enumerate(d["published_skipped"])
            if i > 0}
        return Stats(**d)

    def __enter__(self) -> "Cache":
        return self

    def __exit__(self, *exc: typing.Any) -> bool:
        self.close()
        return False

    def __repr__(self):
        state = "closed" if self.closed else self.namespace
        return f"<encache.Cache {state}>"


_encache._init(
    errors=by_code(_encache.CODES), error_base=Error,
    invalid_error=InvalidError, closed_error=ClosedError,
    fork_error=ForkError, outcomes=tuple(Outcome), skips=tuple(
        Skip(i) if i in Skip._value2member_map_ else i
        for i in range(max(Skip) + 1)),
    describe=_tensors.describe, dtype_of=_tensors.dtype_of,
    device_of=_tensors.device_of,
    # Looked up at each call, so that a test can replace it.
    device_empty=lambda *a: _tensors.device_empty(*a), step_type=Step)

__all__ = [
    "Cache", "Item", "Step", "Result", "Buffer", "Outcome", "Skip", "Stats",
    "Error", "ConfigError", "JsonError", "UrlError", "StoreError",
    "FormatError", "LibraryError", "PoisonedError", "ClosedError",
    "StepsError", "InvalidError", "OutOfMemoryError", "ForkError",
    "MAX_STEPS", "library_version", "mooncake_route", "shm_destroy", "set_block_cache", "url_redact", "model_identity", "purge", "vllm_encoder_hash", "__version__",
]
