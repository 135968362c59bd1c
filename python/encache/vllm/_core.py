# SPDX-License-Identifier: Apache-2.0
"""The logic of encache's vLLM EC connector, without vLLM.

vLLM splits an EC connector in two halves (vLLM 0.32.0,
vllm/distributed/ec_transfer/ec_connector/base.py): a scheduler half that builds
per-step metadata, and a worker half that the model runner drives with that
metadata bound.  This module holds both halves' logic as plain Python over
encache.Cache, so that it is tested without vLLM (tests/vllm); the class
that vLLM loads (encache.vllm.connector) only translates vLLM's objects
into the values used here.

Scheduler half (SchedulerCore): it remembers the image features of each
request (identifier, number of embeddings) and, for the encoder inputs the
scheduler planned for this step, emits a StepPlan: one Candidate per image
(identifier, rows, cols, dtype).  A StepPlan is a frozen dataclass of
strings and integers, so it pickles with vLLM's scheduler output.

Worker half (WorkerCore), per step, in the order the model runner calls
it:
  begin_step(plan, encoder_cache)   start_save_caches (a producer) or
      start_load_caches (ec_both): looks up the planned candidates that
      are not already in encoder_cache and puts each hit there, as a
      tensor on the worker's device; the runner then encodes only the rest.
  publish(encoder_cache, mm_hash)   save_caches: queues the new output
      for publication; an identifier no plan named (a scheduler that
      plans nothing for the images a producer encodes) is made a
      candidate first, by a lookup of its own.
  end_step()                        clear_connector_metadata: closes the
      step.

The lookup is synchronous, in begin_step, as the reference's is: vLLM's
V2 runner calls start_save_caches right after binding the step's
metadata and decides what to encode from the encoder cache right after
that, so a read started at bind time would gain nothing on the worker.
What can start earlier is the scheduler half's (scheduler_prefetch,
Prefetcher below): where the worker shares its process (vLLM's
single-GPU executor), the worker's step takes the hits the scheduler
half read when it planned the step; elsewhere a tier keeps them in the
host's shm.

Failures follow the reference (vLLM's cross-encoder reuse, docs "Shared
Encoder output Store", Failure semantics): every outcome but a hit means
"encode it", and a Store that cannot be reached gives UNAVAILABLE outcomes,
not exceptions; a Store operation whose completion cannot be confirmed
raises encache.PoisonedError, which is let through so that the worker
fails, as vLLM's worker does on an unconfirmed I/O.

Threads: a WorkerCore belongs to the worker's thread, as vLLM's worker
connector does; its Cache serialises its own calls.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import threading
import time
import typing
import weakref

import encache

logger = logging.getLogger("encache.vllm")

# WorkerCore's planned[id] for an output the step loaded from the Store.
_LOADED = object()

# The name vLLM knows the connector by (ec_connector in
# --ec-transfer-config) and the module it is loaded from.
CONNECTOR_NAME = "EncacheECConnector"
CONNECTOR_MODULE = "encache.vllm.connector"

# Options of ec_connector_extra_config that are the connector's own and
# never reach the library (the library reads vLLM's options and encache's
# engine options, docs/configuration.md, from the same object).
OWN_OPTIONS = {
    "store_url": (str, None),
    "inner_ec_connector": (str, "ECMooncakeConnector"),
    "inner_ec_connector_module_path": (str, None),
    "encoder_output_width": (int, None),
    "scheduler_prefetch": (bool, False),
    "scheduler_prefetch_bytes": (int, 256 << 20),
}

# The modalities looked up: the reference covers images only, other
# modalities keep the normal encoder path.
MODALITIES = frozenset({"image"})


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One encoder output the step may load: the identifier (vLLM's
    mm_hash) and the output expected, rows x cols of dtype (a name)."""
    mm_hash: str
    rows: int
    cols: int
    dtype: str


@dataclasses.dataclass(frozen=True)
class StepPlan:
    """The scheduler half's part of a step's metadata.  items: the
    candidates as the library's lookup takes them, (id, dtype, (rows,
    cols)), made once where the plan is made (and pickled with it), so
    that the worker's step hands them to Cache.lookup as they are; ids:
    their identifiers, to test the encoder cache for them in one call."""
    candidates: tuple[Candidate, ...] = ()

    def __post_init__(self):
        object.__setattr__(self, "items", tuple([
            (c.mm_hash, c.dtype, (c.rows, c.cols)) for c in self.candidates]))
        object.__setattr__(self, "ids", tuple([
            c.mm_hash for c in self.candidates]))


@dataclasses.dataclass(frozen=True)
class ConnectorConfig:
    """The connector's configuration, read from vLLM's ec_transfer_config
    (a dict: its ec_connector, ec_role and ec_connector_extra_config).

    enabled: vLLM's cross_encoder_cache (default false: no Store client,
        no publisher, as in the reference).
    store_url: encache's Store; None: $ENCACHE_STORE, else "mooncake:" when
        $MOONCAKE_CONFIG_PATH is set (the reference's Store), else the
        library's default shm Store.
    inner: the connector that delivers outputs to Prefill (vLLM's
        ECMooncakeConnector by default); "" for none.
    library_config: the ec_transfer_config the library is given, without
        the connector's own options.
    """
    role: str
    enabled: bool
    store_url: str | None
    inner: str
    inner_module_path: str | None
    encoder_output_width: int | None
    library_config: dict
    scheduler_prefetch: bool = False
    scheduler_prefetch_bytes: int = 256 << 20

    @classmethod
    def from_ec_transfer_config(cls, cfg: dict) -> ConnectorConfig:
        if not isinstance(cfg, dict):
            raise encache.ConfigError(
                "ec_transfer_config: expected an object")
        extra = cfg.get("ec_connector_extra_config") or {}
        if not isinstance(extra, dict):
            raise encache.ConfigError(
                "ec_connector_extra_config: expected an object")
        own = {}
        for name, (kind, default) in OWN_OPTIONS.items():
            value = extra.get(name, default)
            if value is not None and (
                    not isinstance(value, kind)
                    or (kind is not bool and isinstance(value, bool))):
                raise encache.ConfigError(
                    f"{name}: expected a {kind.__name__}, got {value!r}")
            if isinstance(value, str) and "\0" in value:
                raise encache.ConfigError(f"{name}: holds a NUL character")
            own[name] = value
        if own["encoder_output_width"] is not None and \
                own["encoder_output_width"] <= 0:
            raise encache.ConfigError("encoder_output_width: must be positive")
        if own["scheduler_prefetch_bytes"] < 0:
            raise encache.ConfigError(
                "scheduler_prefetch_bytes: must be 0 (hand no prefetched "
                "output to the worker) or more")
        enabled = extra.get("cross_encoder_cache", False)
        if not isinstance(enabled, bool):
            # The library refuses it too, naming it; say it here as well,
            # before anything is opened.
            raise encache.ConfigError(
                f"cross_encoder_cache: expected a boolean, got {enabled!r}")
        library = {k: v for k, v in cfg.items()
                   if k in ("ec_connector", "ec_role",
                            "ec_connector_extra_config")}
        library["ec_connector_extra_config"] = {
            k: v for k, v in extra.items() if k not in OWN_OPTIONS}
        return cls(role=cfg.get("ec_role") or "", enabled=enabled,
                   store_url=own["store_url"], inner=own["inner_ec_connector"],
                   inner_module_path=own["inner_ec_connector_module_path"],
                   encoder_output_width=own["encoder_output_width"],
                   library_config=library,
                   scheduler_prefetch=own["scheduler_prefetch"],
                   scheduler_prefetch_bytes=own["scheduler_prefetch_bytes"])

    @property
    def is_producer(self) -> bool:
        return self.role in ("ec_producer", "ec_both")

    def resolved_store(self) -> str | None:
        """The Store URL the worker opens (None: the library's default)."""
        if self.store_url is not None:
            return self.store_url
        if os.environ.get("ENCACHE_STORE"):
            return None
        if os.environ.get("MOONCAKE_CONFIG_PATH"):
            return "mooncake:"
        return None


def check_identifiers(enabled: bool, mm_processor_cache_gb) -> None:
    """Refuses what the reference refuses at start-up: with reuse on and
    the processor cache off, an encoder-only instance names images with
    process-local counters, which collide across encoders (vLLM 0.32.0,
    vllm/distributed/ec_transfer/ec_connector/mooncake/config.py,
    MooncakeECConfig: "cross_encoder_cache requires mm_processor_cache_gb
    > 0 to preserve content identifiers across Encoders and restarts")."""
    if enabled and mm_processor_cache_gb is not None and \
            mm_processor_cache_gb <= 0:
        raise ValueError(
            "cross_encoder_cache needs mm_processor_cache_gb > 0: without "
            "the processor cache, multimodal identifiers are process-local "
            "counters that collide across encoders")


# Prefetchers that hand their hits to a worker half of the same process,
# by (Store URL, namespace).  With vLLM's UniProcExecutor (one GPU: the
# "uni" backend) the engine core builds its one worker in its own process
# and runs execute_model on the scheduler's thread (vLLM 0.32.0,
# vllm/v1/executor/uniproc_executor.py: driver_worker, collective_rpc,
# execute_model), so both halves of a connector live there.
_HANDOFFS: dict = {}
_HANDOFFS_LOCK = threading.Lock()

# How long a prefetched hit is kept for the worker half (seconds): the
# worker runs a step within milliseconds of its plan; an output never
# taken (the worker found it in its encoder cache already) is dropped.
PREFETCH_HOLD_SECONDS = 10.0


def handoff_key(store_url: str | None, namespace: str) -> tuple:
    return (store_url or os.environ.get("ENCACHE_STORE") or "", namespace)


def mooncake_client_for_gpu(client: dict, gpu) -> dict | None:
    """vLLM 0.34.0's device_name_per_gpu (vllm/distributed/
    mooncake_store.py: MooncakeStoreConfig.__post_init__ and
    _device_name_for_current_gpu): a list of device names indexed by
    physical GPU id that replaces device_name when set.  Returns the
    client JSON with device_name the entry of `gpu` (an int, or a callable
    that gives it; None: no GPU) and device_name_per_gpu removed, or None
    when the JSON has no device_name_per_gpu (null counts as absent).
    Raises ConfigError as vLLM refuses: both set, a list that is empty or
    holds a blank name, no entry for the GPU."""
    names = client.get("device_name_per_gpu")
    if names is None:
        return None
    if client.get("device_name"):
        raise encache.ConfigError(
            "mooncake.device_name_per_gpu: set device_name or "
            "device_name_per_gpu, not both")
    if not (isinstance(names, list) and names and all(
            isinstance(n, str) and n.strip() for n in names)):
        raise encache.ConfigError(
            "mooncake.device_name_per_gpu: must be a non-empty list of "
            "device names")
    if callable(gpu):
        gpu = gpu()
    if gpu is None:
        raise encache.ConfigError(
            "mooncake.device_name_per_gpu: no GPU is current in this "
            "process to pick an entry for (set device_name instead)")
    if not 0 <= gpu < len(names):
        raise encache.ConfigError(
            f"mooncake.device_name_per_gpu: no entry for physical GPU {gpu}")
    out = {k: v for k, v in client.items() if k != "device_name_per_gpu"}
    out["device_name"] = names[gpu]
    return out


def _mooncake_url_for_gpu(url: str | None, gpu):
    """(URL to open, file to remove after the open or None): a mooncake:
    URL (alone or as a tier's remote) whose client JSON has
    device_name_per_gpu gets a private copy of the JSON with the GPU's
    device_name (mooncake_client_for_gpu): the library reads the client
    JSON once, when the Store opens (src/store/mooncake.c), and does not
    know the process's GPU."""
    if not url:
        return url, None
    head, sep, tail = url.partition("+") if url.startswith("tier:") \
        else ("", "", url)
    if not tail.startswith("mooncake:"):
        return url, None
    path = tail[len("mooncake:"):] or os.environ.get("MOONCAKE_CONFIG_PATH")
    if not path:
        return url, None  # the library says what is missing
    try:
        with open(path, "rb") as f:
            client = json.load(f)
    except (OSError, ValueError):
        return url, None  # the library reports the file as it reads it
    derived = mooncake_client_for_gpu(client, gpu) \
        if isinstance(client, dict) else None
    if derived is None:
        return url, None
    import tempfile
    fd, copy = tempfile.mkstemp(prefix="encache-mooncake-", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(derived, f)
    return head + sep + "mooncake:" + copy, copy


def open_cache(config: ConnectorConfig, library_config: dict,
               namespace: dict, encoder_name: str | None, gpu=None):
    """A half's Cache on the connector's Store: library_config (copied),
    labelled encoder_name unless it names a label of its own.  gpu: the
    physical GPU id for a Mooncake client JSON with device_name_per_gpu
    (an int, or a callable asked only then; mooncake_client_for_gpu)."""
    cfg = json.loads(json.dumps(library_config))
    extra = cfg.setdefault("ec_connector_extra_config", {})
    if encoder_name and "encoder_name" not in extra:
        extra["encoder_name"] = encoder_name
    url, copy = _mooncake_url_for_gpu(
        config.resolved_store() or os.environ.get("ENCACHE_STORE"), gpu)
    try:
        return encache.Cache(cfg, store=url, log=logger.warning, **namespace)
    finally:
        if copy is not None:
            os.unlink(copy)


class Prefetcher:
    """scheduler_prefetch: the scheduler half starts the lookup of the
    step's candidates as soon as it has planned them (lookup(wait=False):
    the reads run on the library's lookup threads, several steps' at once,
    without a Python thread or the GIL).

    Where the worker half lives in the same process (key: the Store URL
    and namespace both halves open), the hits are kept for it, at most
    hold_bytes of them for at most PREFETCH_HOLD_SECONDS, and take() hands
    each to the one worker step that asks for it: the step then reads
    nothing; a candidate whose prefetch is still reading is waited for, not
    read a second time.  Elsewhere (the worker in another process: vLLM's
    multiprocessing or Ray executors) the hits are dropped, and only a tier
    Store keeps them: it promotes each remote hit into the host's shm, so
    that the worker's own lookup a moment later is a local hit.

    Bounded: at most `depth` steps' lookups are pending; a step that finds
    them all pending is not prefetched (counted).  A Store operation that
    cannot be confirmed ends prefetching for the process (the worker's
    lookups are not affected: another handle).  Its calls take a lock: the
    scheduler and the worker may call from different threads."""

    def __init__(self, cache, depth: int = 8, hold_bytes: int = 0,
                 key: tuple | None = None):
        import collections
        self.cache = cache
        self.depth = depth
        self.hold_bytes = hold_bytes
        self.prefetched = self.dropped = self.failed = 0
        self.handed = self.evicted = 0
        self._pending = collections.deque()  # (step, items), oldest first
        # item -> (tensor, bytes, monotonic time kept), oldest first
        self._held = collections.OrderedDict()
        self._held_total = 0
        self._lock = threading.Lock()
        self._stopped = False
        self.key = key if hold_bytes > 0 else None
        if self.key is not None:
            with _HANDOFFS_LOCK:
                _HANDOFFS[self.key] = self

    def _collect(self, block: int) -> None:
        """Closes the completed lookups, oldest first, waiting for the
        first `block` of them (-1: all); keeps their hits.  Lock held."""
        pending = self._pending
        while pending and (block != 0 or pending[0][0].done):
            block -= block > 0
            step, items = pending.popleft()
            try:
                step.wait()
                self.prefetched += len(items)
                if self.key is not None:
                    self._keep(items, step.results)
            except encache.PoisonedError as e:
                self._stop(e)
            except encache.Error as e:
                self.failed += 1
                logger.debug("encache: prefetch failed: %s", e)
            finally:
                step.close()

    def _keep(self, items, results) -> None:
        by_id = {i[0]: i for i in items}
        now = time.monotonic()
        held = self._held
        for r in results:
            if not r.hit:
                continue
            t = r.tensor
            n = t.numel() * t.element_size()
            old = held.pop(by_id[r.id], None)
            if old is not None:
                self._held_total -= old[1]
            held[by_id[r.id]] = (t, n, now)
            self._held_total += n
        while held and self._held_total > self.hold_bytes:
            self._drop_oldest()
        self._expire(now)

    def _expire(self, now: float) -> None:
        """Drops the hits kept longer than PREFETCH_HOLD_SECONDS (the
        oldest first: _held is in the order they were kept)."""
        held = self._held
        while held and next(iter(held.values()))[2] < \
                now - PREFETCH_HOLD_SECONDS:
            self._drop_oldest()

    def _drop_oldest(self) -> None:
        _, (_, n, _) = self._held.popitem(last=False)
        self._held_total -= n
        self.evicted += 1

    def _stop(self, e) -> None:
        if not self._stopped:
            logger.warning("encache: scheduler prefetch stopped: %s", e)
        self._stopped = True
        self.failed += 1

    def submit(self, items) -> bool:
        with self._lock:
            self._collect(0)
            if self._stopped or len(self._pending) >= self.depth:
                self.dropped += 1
                return False
            try:
                step = self.cache.lookup(items, wait=False)
            except encache.PoisonedError as e:
                self._stop(e)
                return False
            except encache.Error as e:
                self.failed += 1
                logger.debug("encache: prefetch failed: %s", e)
                return False
            self._pending.append((step, items))
            return True

    def take(self, items) -> tuple[list, list]:
        """The worker half's step: (hits, rest).  hits: (identifier,
        tensor) of the items prefetched, each handed to this call alone;
        rest: the items the step must look up itself.  Waits for a pending
        prefetch of one of the items (never longer than its own read)."""
        with self._lock:
            wanted = set(items)
            last = 0
            for k, (_, pending_items) in enumerate(self._pending, 1):
                if not wanted.isdisjoint(pending_items):
                    last = k
            self._collect(last)
            held = self._held
            if not held:
                return [], items
            self._expire(time.monotonic())  # kept too long: read again
            hits, rest = [], []
            for item in items:
                got = held.pop(item, None)
                if got is None:
                    rest.append(item)
                else:
                    self._held_total -= got[1]
                    hits.append((item[0], got[0]))
            self.handed += len(hits)
            return hits, rest

    def wait(self) -> None:
        """Until every submitted step is read (tests, shutdown)."""
        with self._lock:
            self._collect(-1)

    def close(self) -> None:
        with _HANDOFFS_LOCK:
            if self.key is not None and _HANDOFFS.get(self.key) is self:
                del _HANDOFFS[self.key]
        with self._lock:
            self._stopped = True
            self._collect(-1)
            self._held.clear()
            self._held_total = 0
        try:
            self.cache.close()
        except encache.Error as e:
            logger.warning("encache: scheduler prefetch: %s", e)


class SchedulerCore:
    """The scheduler half: remembers each request's image features and
    plans, per step, the candidates of the encoder inputs scheduled.
    namespace (dict(model=, revision=, encoder_hash=, dtype=), as
    WorkerCore's): given with scheduler_prefetch on, for its Cache (gpu:
    as WorkerCore's)."""

    def __init__(self, config: ConnectorConfig, cols: int, dtype: str,
                 namespace: dict | None = None,
                 encoder_name: str | None = None, gpu=None):
        self.config = config
        self.cols = config.encoder_output_width or cols
        self.dtype = dtype
        # request id -> [(identifier, rows, modality)], in feature order.
        self._features: dict[str, list[tuple[str, int, str]]] = {}
        self.prefetcher = None
        if config.enabled and config.is_producer and \
                config.scheduler_prefetch and namespace is not None:
            cache = open_cache(config, config.library_config, namespace,
                               encoder_name, gpu)
            self.prefetcher = Prefetcher(
                cache, hold_bytes=config.scheduler_prefetch_bytes,
                key=handoff_key(config.resolved_store(), cache.namespace))

    def note_request(self, req_id: str,
                     features: typing.Iterable[tuple[str, int, str]]) -> None:
        """Records a request's features (identifier, embeddings, modality)
        the first time they are seen (a new request in the scheduler's
        output, or ensure_cache_available)."""
        if req_id not in self._features:
            self._features[req_id] = list(features)

    def plan(self, scheduled_encoder_inputs: dict[str, list[int]]) -> StepPlan:
        """The StepPlan of a step: scheduled_encoder_inputs is vLLM's
        SchedulerOutput field (request id -> indices of its features to
        encode this step)."""
        if not self.config.enabled or not self.config.is_producer:
            return StepPlan()
        seen = set()
        out = []
        for req_id, indices in scheduled_encoder_inputs.items():
            features = self._features.get(req_id)
            if not features:
                continue
            for i in indices:
                if not 0 <= i < len(features):
                    continue
                ident, rows, modality = features[i]
                if modality not in MODALITIES or ident in seen or rows <= 0:
                    continue
                seen.add(ident)
                out.append(Candidate(ident, rows, self.cols, self.dtype))
        if out and self.prefetcher is not None:
            self.prefetcher.submit([(c.mm_hash, c.dtype, (c.rows, c.cols))
                                    for c in out])
        return StepPlan(tuple(out))

    def forget(self, req_id: str) -> None:
        self._features.pop(req_id, None)

    def close(self) -> None:
        prefetcher, self.prefetcher = self.prefetcher, None
        if prefetcher is not None:
            prefetcher.close()


@dataclasses.dataclass
class WorkerCounters:
    """What the connector did, beyond the library's own counters."""
    steps: int = 0
    looked_up: int = 0
    loaded: int = 0
    already_local: int = 0
    published: int = 0
    publish_skipped: int = 0
    unplanned: int = 0
    lookup_errors: int = 0
    prefetched: int = 0


class WorkerCore:
    """The worker half over one encache.Cache (none when reuse is off).

    namespace: dict(model=, revision=, encoder_hash=, dtype=), the key
    fields as vLLM's reuse takes them (encache.vllm.connector fills it from
    vLLM's model config); device: where hits go ("cpu", "cuda:N", or
    "cuda": the GPU current on the worker's thread at each step); gpu: the
    physical GPU id for a Mooncake client's device_name_per_gpu
    (open_cache)."""

    def __init__(self, config: ConnectorConfig, namespace: dict,
                 device: str = "cpu", encoder_name: str | None = None,
                 gpu=None):
        self.config = config
        self._gpu = gpu
        self.device = device
        self._counters = WorkerCounters()
        self._namespace = dict(namespace)
        self._encoder_name = encoder_name
        self._device = None if device == "cpu" else device
        self._warned_mismatch = False
        self._handoff_key = None
        cache = self._open(config.library_config) \
            if config.enabled and config.is_producer else None
        # The step's state and its per-step calls, in C (python/_encache/
        # vllm_hooks.c): the open step, the plan bound, what was looked up
        # for publish(), the per-step counters; begin() calls _begin_with
        # for the rare cases and _lookup_failed on a rejected lookup,
        # through a weak proxy: the state holds no cycle back to this
        # core, so a core dropped unclosed frees its Cache at once.
        me = weakref.proxy(self)
        self.state = encache._encache.WorkerStep(
            cache, functools.partial(WorkerCore._begin_with, me),
            functools.partial(WorkerCore._lookup_failed, me), _HANDOFFS,
            self._device is not None)

    def _open(self, library_config: dict):
        cache = open_cache(self.config, library_config, self._namespace,
                           self._encoder_name, self._gpu)
        url = self.config.resolved_store() or os.environ.get("ENCACHE_STORE")
        self._handoff_key = handoff_key(url, cache.namespace)
        logger.info("encache: cross-encoder reuse on %s, namespace %s",
                    encache.url_redact(url) if url else
                    "the default shm Store", cache.namespace)
        return cache

    @property
    def cache(self):
        """The encache.Cache (None when reuse is off)."""
        return self.state.cache

    @property
    def open(self) -> bool:
        """A step is begun or open (end_step has something to do)."""
        return self.state.open

    @property
    def namespace(self) -> str | None:
        cache = self.state.cache
        return cache.namespace if cache is not None else None

    @property
    def counters(self) -> WorkerCounters:
        c, st = self._counters, self.state
        c.steps, c.looked_up, c.loaded = st.steps, st.looked_up, st.loaded
        return c

    # ----------------------------------------------------------- a step

    def begin_step(self, plan: StepPlan | None,
                   encoder_cache: dict | None) -> int:
        """Looks the plan's candidates up; each hit is put in
        encoder_cache under its identifier.  Returns the number loaded.
        Called once per step (a second call, e.g. start_load_caches after
        start_save_caches on ec_both, does nothing).  The connector's
        hooks call self.state.begin(encoder_cache) with the plan bound
        (bind_connector_metadata); the common step (a host worker, none of
        the items in encoder_cache, no prefetched hit to take) is done in
        C, the others in _begin_with (docs/vllm.md, Cost)."""
        return self.state.begin(encoder_cache, plan)

    def _begin_with(self, plan: StepPlan, items, encoder_cache) -> int:
        """begin_step's other cases: some items already local, prefetched
        hits to take, hits for a device, a step opened before."""
        counters, st = self.counters, self.state
        loaded = 0
        if encoder_cache:
            todo = [i for i in items if i[0] not in encoder_cache]
            counters.already_local += len(items) - len(todo)
            items = todo
        if _HANDOFFS and items:
            prefetcher = _HANDOFFS.get(self._handoff_key)
            if prefetcher is not None:
                hits, items = prefetcher.take(items)
                for ident, tensor in hits:
                    encoder_cache[ident] = tensor if self._device is None \
                        else tensor.to(self._current_device())
                    st.planned[ident] = _LOADED  # as publish() sees hits
                loaded = len(hits)
                counters.prefetched += loaded
                st.loaded += loaded
        if not items:
            return loaded
        if self._device is not None:
            device = self._current_device()
            items = [(i, d, s, device) for i, d, s in items]
        st.looked_up += len(items)
        try:
            step = st.step
            if step is None:  # one call: open the step and look up
                st.step = step = st.cache.lookup(items)
                hits = step.hits
            else:  # a step opened before: only this lookup's hits
                hits = {r.id: r.tensor for r in step.lookup(items) if r.hit}
        except encache.PoisonedError:
            raise
        except encache.Error as e:
            return loaded + self._lookup_failed(e)
        st.looked.append((plan, items))
        encoder_cache.update(hits)
        st.loaded += len(hits)
        return loaded + len(hits)

    def _lookup_failed(self, e) -> int:
        # Bad input, memory: encode instead, as the reference falls back
        # on a rejected lookup.
        self.counters.lookup_errors += 1
        logger.warning("encache: lookup failed, encoding instead: %s", e)
        return 0

    def _current_device(self) -> str:
        if self._device == "cuda":  # the worker's current GPU, at each step
            import torch
            return f"cuda:{torch.cuda.current_device()}"
        return self._device

    def _planned_now(self) -> dict:
        """The candidates this step looked up, by identifier (made on
        publish()'s first call of the step); _LOADED for those it loaded
        from the Store."""
        st = self.state
        planned = st.planned
        for plan, items in st.looked:
            looked = {i[0] for i in items}
            for c in plan.candidates:
                if c.mm_hash in looked:
                    planned[c.mm_hash] = c
        st.looked.clear()
        for r in st.step.results:
            if r.hit:
                planned[r.id] = _LOADED
        return planned

    def publish(self, encoder_cache: dict, mm_hash: str):
        """Queues encoder_cache[mm_hash], just encoded, for publication.
        Returns the encache.Skip, or None when reuse is off, the output is
        not there, or this step loaded it from the Store (vLLM's V1 model
        runner encodes every scheduled input, the hits put in its encoder
        cache included, and calls save_caches for each: the object is in
        the Store, so nothing is copied or checked again)."""
        st = self.state
        if st.cache is None:
            return None
        tensor = encoder_cache.get(mm_hash) if encoder_cache else None
        if tensor is None:
            return None
        if st.step is None:
            st.step = st.cache.step()
            st.open = True
        step = st.step
        planned = self._planned_now() if st.looked else st.planned
        if planned.get(mm_hash) is _LOADED:
            self.counters.publish_skipped += 1
            return None
        if mm_hash not in planned:
            # No plan named it: make it a candidate of this step with the
            # output's own contract (a hit here means another encoder
            # published it meanwhile: nothing to write).
            self.counters.unplanned += 1
            if tensor.dim() != 2:
                self.counters.publish_skipped += 1
                return encache.Skip.NOT_MATRIX
            try:
                [r] = step.lookup([encache.Item(
                    mm_hash, tensor.dtype, tuple(tensor.shape), "cpu")])
            except encache.PoisonedError:
                raise
            except encache.Error as e:
                self.counters.publish_skipped += 1
                logger.debug("encache: %s not published: %s", mm_hash, e)
                return None
            planned[mm_hash] = None
            if r.hit:
                self.counters.publish_skipped += 1
                return encache.Skip.PENDING
        try:
            skip = step.publish(mm_hash, tensor)
        except encache.PoisonedError:
            raise
        except encache.Error as e:
            # A tensor the library cannot take (another device kind, a
            # sparse layout): the serving path goes on, unpublished.
            self.counters.publish_skipped += 1
            logger.warning("encache: %s not published: %s", mm_hash, e)
            return None
        if skip == encache.Skip.QUEUED:
            self.counters.published += 1
        elif skip == encache.Skip.MISMATCH and not self._warned_mismatch:
            # The plan's contract is not the encoder's output: no output of
            # this model will ever be published.  Say so once.
            self._warned_mismatch = True
            self.counters.publish_skipped += 1
            c = planned.get(mm_hash)
            logger.warning(
                "encache: the output of %s is %s %s, the plan expected "
                "%sx%s %s: not published (set encoder_output_width in "
                "ec_connector_extra_config if the model's encoder outputs "
                "are not as wide as its input embeddings)", mm_hash,
                "x".join(map(str, tuple(tensor.shape))), tensor.dtype,
                getattr(c, "rows", "?"), getattr(c, "cols", "?"),
                getattr(c, "dtype", "?"))
        else:
            self.counters.publish_skipped += 1
            logger.debug("encache: %s not published: %s", mm_hash,
                         getattr(skip, "name", skip))
        return skip

    def end_step(self) -> None:
        """Closes the step (its queued publications go on)."""
        self.state.end()

    # ------------------------------------------------------- run time

    def switch_namespace(self, embedding_model_identity: str | None = None,
                         **fields) -> str | None:
        """Moves to a new namespace without a restart (new weights in an
        RL or fine-tuning loop): embedding_model_identity replaces the key's
        model field (a weight epoch or digest, e.g. encache.model_identity
        of the new checkpoint); fields may replace model, revision or
        encoder_hash.  Publications queued under the old namespace are
        written first; the next step looks up and publishes under the new
        one.  Returns the new namespace."""
        if self.cache is None:
            return None
        cfg = json.loads(json.dumps(self.config.library_config))
        extra = cfg.setdefault("ec_connector_extra_config", {})
        if embedding_model_identity is not None:
            extra["embedding_model_identity"] = embedding_model_identity
        unknown = set(fields) - {"model", "revision", "encoder_hash"}
        if unknown:
            raise encache.InvalidError(
                f"switch_namespace: unknown field {sorted(unknown)[0]}")
        namespace = dict(self._namespace, **fields)
        old_namespace = self._namespace
        self._namespace = namespace
        try:
            new = self._open(cfg)  # refused: the old Cache stays in use
        except BaseException:
            self._namespace = old_namespace
            raise
        self.end_step()
        old, self.state.cache = self.state.cache, new
        self.config = dataclasses.replace(self.config, library_config=cfg)
        old.close()
        return new.namespace

    def stats(self):
        return self.cache.stats() if self.cache is not None else None

    def close(self) -> None:
        """Closes the step and the Cache (waits for queued publications).
        Raises PoisonedError when the Cache was poisoned."""
        try:
            self.end_step()
        except encache.Error:
            pass  # a poisoned step: close below reports it
        cache, self.state.cache = self.state.cache, None
        if cache is None:
            return
        try:
            s = cache.stats()
            logger.info(
                "encache: %d steps, %d looked up, %d loaded (%d from the "
                "scheduler's prefetch), %d published (%d written), %d "
                "unavailable", self.counters.steps,
                self.counters.looked_up, self.counters.loaded,
                self.counters.prefetched,
                self.counters.published, s.published_written, s.unavailable)
        except encache.Error:
            pass
        cache.close()
