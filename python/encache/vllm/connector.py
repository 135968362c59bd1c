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

vLLM sources followed (vllm-project/vllm; file, commit of the copy read):
- vllm/distributed/ec_transfer/ec_connector/base.py,
  035e2dd3a4b5edaa4c3f3ab98795f6e34eebf2c6: the abstract methods and hooks
  (tests/vllm/test_contract.py lists them).
- vllm/distributed/ec_transfer/ec_connector/mooncake_ec_connector.py,
  0b319fdcfe2ab13f1358b9de85bd0459fd93451d: the producer's
  start_save_caches(**kwargs), start_worker_services,
  take_unavailable_requests, update_state_after_free, and
  ensure_cache_available(request, num_computed_tokens,
  local_cache_hashes): forwarded when the inner connector has them.
- vllm/distributed/ec_transfer/ec_connector/factory.py,
  03d01c47230ca0c740122d8d2129a0ebe22cf72a: register_connector(name,
  module_path, class_name) and get_connector_class (registered names
  only in that version; others also load ec_connector_module_path).
- vllm/v1/worker/gpu/ec_connector.py (ActiveECConnector.maybe_get_output),
  the version that calls start_save_caches(encoder_cache=...) on a
  producer before it snapshots the encoder cache's keys and saves the new
  ones (matched by content; the copy stored under that path, commit
  055e47c28003156421365af985d676fc921cb075, calls only start_load_caches,
  on consumers), and vllm/v1/worker/ec_connector_model_runner_mixin.py,
  0a82ef1119e4b94ae3ec16071cd40680e704e963 (start_load_caches only when
  not a producer; save_caches per new output): the worker's order.
- vllm/v1/core/sched/scheduler.py (_try_schedule_encoder_inputs,
  b4622cf924bc72504aed99e486062d6633fde39e): has_cache_item(identifier) True makes an input an
  external load that the scheduler does not encode; so on a producer the
  answer stays the inner connector's, and hits are found by the worker.
- tests/v1/ec_connector/unit/test_cross_encoder_cache.py,
  b2381d81fcfee38e58487868cef5f35e14ddc2e9 (a protocol:v2 version; the v3
  copy, with make_embedding_key and the 24-byte header, is matched by
  content): store_candidates in the step's metadata, the lookup in
  start_save_caches, publication in save_caches, the
  mm_processor_cache_gb refusal (test_reuse_pipeline,
  test_shared_reuse_requires_content_stable_identifiers).
- .../mooncake_store_embedding/data.py (build_embedding_namespace, matched
  by content, docs/compatibility.md): the key fields.

The producer needs vLLM's model runner V2 (its encoder runner encodes only
the inputs not in the encoder cache), as the reference does.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib
import logging
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


def namespace_fields(vllm_config) -> dict:
    """The key fields, taken from vLLM's objects as vLLM's reuse takes
    them (build_embedding_namespace): the model path through str() (the
    library applies embedding_model_identity and embedding_cache_prefix
    from the configuration itself), revision or 'default', the multimodal
    config's own compute_hash() (none: encoder:default), the model's
    dtype (str(dtype) in the key)."""
    mc = vllm_config.model_config
    mm = getattr(mc, "multimodal_config", None)
    return {"model": str(mc.model),
            "revision": mc.revision or None,
            "encoder_hash": mm.compute_hash() if mm is not None else None,
            "dtype": mc.dtype}


def output_cols(model_config) -> int:
    """The width of the encoder outputs in vLLM's encoder cache: the
    embedding size of the language model's inputs."""
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


def _make_inner(vllm_config, role, config: _core.ConnectorConfig):
    """The delivery connector: vLLM's configuration with ec_connector set
    to inner_ec_connector and reuse off, built by vLLM's factory (or from
    inner_ec_connector_module_path)."""
    if not config.inner:
        return None
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
    return cls(inner_config, role)


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
                self._config, output_cols(vllm_config.model_config),
                str(vllm_config.model_config.dtype),
                namespace=namespace_fields(vllm_config),
                encoder_name=_encoder_name(vllm_config, "scheduler"))
        elif role == ECConnectorRole.WORKER:
            self._worker = _core.WorkerCore(
                self._config, namespace_fields(vllm_config),
                device=_device_of(vllm_config),
                encoder_name=_encoder_name(vllm_config, "worker"))
        else:
            raise ValueError(f"Unknown EC connector role: {role}")
        # The worker half that looks up (a producer's), decided once, and
        # its step's calls in C (python/src/worker.c), taken once: the
        # per-step hooks make one call each.  Elsewhere a state without a
        # Cache, whose calls do nothing.
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

    # The three hooks of a step (bind_connector_metadata,
    # start_save_caches, clear_connector_metadata) are ConnectorHooks',
    # in C (python/src/worker.c), and so is the delegation of the inner
    # connector's hooks that this class does not define (they vary between
    # vLLM versions: start_worker_services, take_unavailable_requests,
    # update_state_after_free, ...): an attribute this class lacks is the
    # inner connector's.  bind and clear set the base class's
    # _connector_metadata themselves, as ECConnectorBase's two methods do
    # and nothing else (vllm/distributed/ec_transfer/ec_connector/base.py
    # at 035e2dd3a4b5edaa4c3f3ab98795f6e34eebf2c6; tests/vllm/
    # test_contract.py checks that they still do only that), then call the
    # producer's WorkerStep and the inner connector's hook of the same
    # name.  In Python, the three frames and a __getattr__ were most of
    # what the connector added to a step of small hits (docs/vllm.md,
    # Cost).

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
