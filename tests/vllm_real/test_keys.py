# SPDX-License-Identifier: Apache-2.0
"""The keys and objects encache's connector writes are those vLLM's own
reuse code makes (the installed vLLM's functions, imported, not
re-created): build_embedding_namespace(vllm_config) and
make_embedding_key(namespace, identifier)
(vllm/distributed/ec_transfer/ec_connector/mooncake_store_embedding/
data.py), and the 24-byte header of store_client.py
(_encode_mooncake_tensor_metadata), over a grid of real configurations:
two models, revisions, dtypes, prefixes, model identities and
non-default MultiModalConfig settings (whose compute_hash() is the
namespace's encoder field), and identifiers of every shape."""

import hashlib
import itertools
import os
import pickle

import pytest
import torch

from conftest import encache_tool, real_config, request, reuse_extra

from vllm.distributed.ec_transfer.ec_connector.base import ECConnectorRole
from vllm.distributed.ec_transfer.ec_connector.encoder_output_width import (
    get_encoder_output_width)
from vllm.distributed.ec_transfer.ec_connector.mooncake_store_embedding \
    import data, store_client
from vllm.v1.core.sched.output import SchedulerOutput

from encache.vllm import connector as ecc

REVISIONS = [None, "", "rev:1", "main@2024"]
DTYPES = ["float32", "float16", "bfloat16"]
# ec_connector_extra_config's key fields
KEY_OPTIONS = [{}, {"embedding_cache_prefix": "team@cache"},
               {"embedding_model_identity": "shared/model"},
               {"embedding_cache_prefix": 7,
                "embedding_model_identity": "vit@weights:xxh128:00ff"}]
# MultiModalConfig settings (ModelConfig's options), each changing
# compute_hash() in vLLM 0.32.0
MM_OPTIONS = [{}, {"mm_encoder_attn_backend": "TORCH_SDPA"},
              {"mm_encoder_tp_mode": "data"},
              {"mm_encoder_attn_dtype": "fp8"},
              {"mm_encoder_attn_dtype": "fp8",
               "mm_encoder_fp8_scale_path": "config.json"},  # in the model
              {"mm_device_do_normalize": True},
              {"mm_processor_cache_gb": 8},  # not a hash factor
              ]


def _grid(models):
    """(model, revision, dtype, key options, multimodal options): every
    model x revision x dtype, the key and multimodal options in turn."""
    key_opts = itertools.cycle(KEY_OPTIONS)
    mm_opts = itertools.cycle(MM_OPTIONS)
    for model, revision, dtype in itertools.product(models, REVISIONS,
                                                    DTYPES):
        yield model, revision, dtype, next(key_opts), next(mm_opts)


def test_namespaces_are_vllms_over_a_grid(model_dir, plain_model_dir, store):
    url = store()
    hashes, namespaces = set(), set()
    for model, revision, dtype, key, mm in _grid([model_dir,
                                                  plain_model_dir]):
        if "mm_encoder_fp8_scale_path" in mm:  # vLLM wants a file there
            mm = dict(mm, mm_encoder_fp8_scale_path=os.path.join(
                model, mm["mm_encoder_fp8_scale_path"]))
        config = real_config(model, extra=reuse_extra(url, **key),
                             revision=revision, dtype=dtype, **mm)
        worker = ecc.EncacheECConnector(config, ECConnectorRole.WORKER)
        try:
            namespace = worker.namespace
        finally:
            worker.shutdown()
        assert namespace == data.build_embedding_namespace(config), \
            (model, revision, dtype, key, mm)
        hashes.add(config.model_config.multimodal_config.compute_hash())
        namespaces.add(namespace)
    # The grid did vary what it meant to: six distinct encoder hashes
    # (mm_processor_cache_gb is no factor), and of 48 configurations 23
    # namespaces (None and "" are both revision:default, and an
    # embedding_model_identity stands for either model).
    assert len(hashes) == 6 and len(namespaces) == 23, (hashes, namespaces)


def test_no_multimodal_config_is_encoder_default(model_dir, store):
    config = real_config(model_dir, extra=reuse_extra(store()))
    object.__setattr__(config.model_config, "multimodal_config", None)
    assert ecc.namespace_fields(config)["encoder_hash"] is None
    worker = ecc.EncacheECConnector(config, ECConnectorRole.WORKER)
    try:
        namespace = worker.namespace
    finally:
        worker.shutdown()
    assert namespace == data.build_embedding_namespace(config)
    assert "@encoder:encoder:default@" in namespace


IDENTIFIERS = ["img-A", hashlib.sha256(b"an image").hexdigest(), "image@1",
               "a:b@c/d e", "\u00e9t\u00e9-\U0001f600"]


def _step(config, identifiers, rows=3):
    """One producer step through both halves, as vLLM's scheduler and V2
    runner call them (the metadata crosses by pickle); the outputs
    encoded, published and the Store's writes waited for.  Returns
    (namespace, the plan's candidates, the outputs by identifier)."""
    s = ecc.EncacheECConnector(config, ECConnectorRole.SCHEDULER)
    w = ecc.EncacheECConnector(config, ECConnectorRole.WORKER)
    try:
        req = request("r1", identifiers, rows=rows)
        s.ensure_cache_available(req, 0)
        out = SchedulerOutput.make_empty()
        out.scheduled_encoder_inputs = {"r1": list(range(len(identifiers)))}
        meta = pickle.loads(pickle.dumps(s.build_connector_meta(out)))
        cache = {}
        w.bind_connector_metadata(meta)
        w.start_save_caches(encoder_cache=cache)
        before = set(cache)
        for c in meta.plan.candidates:  # the encoder
            g = torch.Generator().manual_seed(len(c.mm_hash))
            cache[c.mm_hash] = torch.randn(
                c.rows, c.cols, generator=g).to(config.model_config.dtype)
        for mm_hash in cache.keys() - before:
            w.save_caches(encoder_cache=cache, mm_hash=mm_hash)
        w.get_finished(set())
        w.clear_connector_metadata()
        namespace = w.namespace
        return namespace, meta.plan.candidates, cache
    finally:
        w.shutdown()  # waits for the queued publications
        s.shutdown()


@pytest.mark.parametrize("dtype", DTYPES)
def test_objects_are_under_vllms_keys_with_vllms_header(model_dir, store,
                                                       dtype):
    url = store()
    config = real_config(model_dir, dtype=dtype, revision="rev:1",
                         extra=reuse_extra(url, embedding_cache_prefix="p"))
    namespace, candidates, outputs = _step(config, IDENTIFIERS)
    assert namespace == data.build_embedding_namespace(config)
    assert [c.mm_hash for c in candidates] == IDENTIFIERS
    for ident in IDENTIFIERS:
        key = data.make_embedding_key(namespace, ident)
        obj = encache_tool("get", key, "--store", url).stdout
        tensor = outputs[ident]
        assert obj[:24] == store_client._encode_mooncake_tensor_metadata(
            tensor), ident
        assert obj[24:] == tensor.contiguous().view(torch.uint8).numpy() \
            .tobytes(), ident


def test_planned_outputs_are_vllms_tensor_specs(model_dir, store):
    # What vLLM's own producer expects of each output (ECMooncakeScheduler.
    # _encoder_output_spec, vLLM 0.32.0 mooncake/scheduler.py: rows from
    # the request, the width measured at start-up, str(dtype)) is what
    # encache plans; the scheduler is made after the measurement, as
    # vLLM's engine core makes it (vllm/v1/engine/core.py).
    import types
    from vllm.distributed.ec_transfer.ec_connector.encoder_output_width \
        import measure_encoder_output_widths
    from vllm.distributed.ec_transfer.ec_connector.mooncake.scheduler \
        import ECMooncakeScheduler
    config = real_config(model_dir, dtype="bfloat16",
                         extra=reuse_extra(store()))
    measure_encoder_output_widths(config, lambda f: [{"image": 192}])
    assert get_encoder_output_width(config, "image") == 192
    req = request("r1", ["a", "b"], rows=5)
    s = ecc.EncacheECConnector(config, ECConnectorRole.SCHEDULER)
    try:
        s.ensure_cache_available(req, 0)
        out = SchedulerOutput.make_empty()
        out.scheduled_encoder_inputs = {"r1": [0, 1]}
        plan = s.build_connector_meta(out).plan
    finally:
        s.shutdown()
    half = types.SimpleNamespace(_vllm_config=config,
                                 _model_config=config.model_config)
    for i, c in enumerate(plan.candidates):
        spec = ECMooncakeScheduler._encoder_output_spec(half, req, i)
        assert (c.rows, c.cols) == spec.shape and c.dtype == spec.dtype
        assert c.rows * c.cols * 2 == spec.nbytes


def test_a_vllm_without_compute_hash_hashes_with_hash_config(monkeypatch):
    # vLLM 0.34.0's data.py: encoder_hash = hash_config(multimodal_config)
    # (vllm/config/utils.py; its MultiModalConfig has no compute_hash()).
    # vLLM 0.32.0 has neither that function nor that form, so both are
    # stood in for here: what is tested is that encache takes that path.
    import types
    import vllm.config.utils
    seen = []

    def hash_config(cfg):
        seen.append(cfg)
        return "sha256-of-compile-factors"

    monkeypatch.setattr(vllm.config.utils, "hash_config", hash_config,
                        raising=False)
    mm = types.SimpleNamespace(mm_encoder_tp_mode="weights")
    assert ecc.encoder_hash_of(mm) == "sha256-of-compile-factors"
    assert seen == [mm]
    assert ecc.encoder_hash_of(None) is None
