# SPDX-License-Identifier: Apache-2.0
"""The connector's keys equal those vLLM's reuse code builds for the same
configuration.  vllm_namespace() below re-creates
build_embedding_namespace() and make_embedding_key() of vLLM's
vllm/distributed/ec_transfer/ec_connector/mooncake_store_embedding/data.py
(protocol v3, vLLM 0.32.0; tests/vllm_real/test_keys.py compares the
connector with the installed vLLM's own functions); the key of
test_embedding_key_combines_namespace_and_identifier in vLLM's
tests/v1/ec_connector/unit/test_cross_encoder_cache.py (the v3 copy,
matched by content) is checked as written there."""

import pytest
import torch

import ectest
import vllm_fakes as vf


def vllm_namespace(config):
    """vLLM's build_embedding_namespace(vllm_config), re-created."""
    model_config = config.model_config
    extra = config.ec_transfer_config.ec_connector_extra_config
    multimodal_config = model_config.multimodal_config
    encoder_hash = (multimodal_config.compute_hash()
                    if multimodal_config is not None else "encoder:default")
    cache_prefix = str(extra.get("embedding_cache_prefix", ""))
    model_name = str(extra.get("embedding_model_identity", model_config.model))
    prefix = f"{cache_prefix}@" if cache_prefix else ""
    return (f"{prefix}embedding"
            f"@model:{model_name}"
            f"@revision:{model_config.revision or 'default'}"
            f"@encoder:{encoder_hash}"
            f"@dtype:{model_config.dtype}"
            f"@protocol:v3")


def make_embedding_key(namespace, identifier):
    return f"{namespace}@id:{identifier}"


CASES = {
    "defaults": ({}, {}),
    "prefix and identity": (
        {"embedding_cache_prefix": "team@cache",
         "embedding_model_identity": "shared/model"}, {}),
    "revision": ({}, {"revision": "rev:1"}),
    "empty revision": ({}, {"revision": ""}),
    "no multimodal config": ({}, {"multimodal": False}),
    "bfloat16": ({}, {"dtype": torch.bfloat16}),
    "float16 and identity digest": (
        {"embedding_model_identity": "vit@weights:xxh128:00ff"},
        {"dtype": torch.float16}),
    "prefix that is not a string": ({"embedding_cache_prefix": 7}, {}),
}


@pytest.mark.parametrize("case", CASES)
def test_namespace_is_vllms(engines, shm, case):
    extra, model = CASES[case]
    config = vf.vllm_config(shm(), model_config=vf.ModelConfig(**model),
                            **extra)
    e = engines(config)
    assert e.worker.namespace == vllm_namespace(config)


def test_the_key_of_vllms_own_test(engines, shm):
    # tests/v1/ec_connector/unit/test_cross_encoder_cache.py (v3):
    # prefix "team@cache", identity "shared/model", revision "rev:1",
    # float32, no multimodal config, identifier "image@1".
    config = vf.vllm_config(
        shm(), embedding_cache_prefix="team@cache",
        embedding_model_identity="shared/model",
        model_config=vf.ModelConfig(revision="rev:1", multimodal=False))
    e = engines(config)
    assert make_embedding_key(e.worker.namespace, "image@1") == (
        "team@cache@embedding@model:shared/model@revision:rev:1"
        "@encoder:encoder:default@dtype:torch.float32@protocol:v3@id:image@1")


def test_default_multimodal_hash_is_vllms():
    # vLLM 0.32.0's MultiModalConfig().compute_hash() (its factors [None,
    # 'weights', None, None, True]); tests/vllm_real/test_stand_ins.py
    # compares the stand-in with the real class over several settings.
    assert vf.MultiModalConfig().compute_hash() == \
        "8658476b2a0fa47e54f56cb92e3f1162"


def test_published_objects_are_under_vllms_keys_with_vllms_header(
        engines, shm):
    # The object: vLLM's 24-byte header (docs/format.md, as
    # store_client.py writes it: magic 0x4D4F4F4E, dtype code, rows, cols,
    # little-endian), then the output's bytes.
    import struct
    url = shm()
    config = vf.vllm_config(url)
    e = engines(config)
    e.step([vf.request("r1", ["img-A"])])
    expected = e.encoder_cache["img-A"]
    e.worker.shutdown()
    key = make_embedding_key(vllm_namespace(config), "img-A")
    obj = ectest.tool("get", key, store=url).stdout
    assert obj[:24] == struct.pack("<IIQQ", 0x4D4F4F4E, 0, 4, 8)
    assert obj[24:] == expected.numpy().tobytes()
