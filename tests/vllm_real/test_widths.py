# SPDX-License-Identifier: Apache-2.0
"""The width of a producer's planned outputs is vLLM's: the width vLLM
measured at start-up (get_encoder_output_width, vllm/distributed/
ec_transfer/ec_connector/encoder_output_width.py, vLLM 0.32.0), which for
a DeepStack model (Qwen3-VL) is out_hidden_size * (1 + DeepStack layers),
wider than the language model's input embeddings.  The configuration is a
real Qwen3-VL one (tiny_vlm.py).  vLLM measures the width by encoding a
dummy image with the loaded model; no model is loaded here, so
measure_encoder_output_widths (vLLM's) is given, in place of its workers'
report, what Qwen3-VL's vision tower emits (vllm/model_executor/models/
qwen3_vl.py, vLLM 0.32.0: out_hidden_size = vision_config.out_hidden_size
* (1 + len(deepstack_visual_indexes)))."""

import pytest

from conftest import real_config, reuse_extra

from vllm.distributed.ec_transfer.ec_connector.encoder_output_width import (
    get_encoder_output_width, measure_encoder_output_widths)

import tiny_vlm
from encache.vllm import connector as ecc

QWEN3_VL_WIDTH = tiny_vlm.VISION_OUT * (1 + len(tiny_vlm.DEEPSTACK))


def _measured(config, widths):
    measure_encoder_output_widths(config, lambda fn: [dict(widths)])
    return config


def _planned_cols(config):
    from vllm.distributed.ec_transfer.ec_connector.base import ECConnectorRole
    s = ecc.EncacheECConnector(config, ECConnectorRole.SCHEDULER)
    try:
        return s.core.cols
    finally:
        s.shutdown()


def test_a_deepstack_model_plans_vllms_measured_width(model_dir, store):
    config = _measured(real_config(model_dir, extra=reuse_extra(store())),
                       {"image": QWEN3_VL_WIDTH, "video": QWEN3_VL_WIDTH})
    vllms = get_encoder_output_width(config, "image")
    assert vllms == QWEN3_VL_WIDTH == 192
    assert config.model_config.get_inputs_embeds_size() == 64  # narrower
    assert ecc.output_cols(config) == vllms
    assert _planned_cols(config) == vllms


def test_the_measured_width_wins_over_the_configurations(model_dir, store):
    # Whatever the model reports is what vLLM sizes by: encache follows
    # the measurement, not its own reading of the configuration.
    config = _measured(real_config(model_dir, extra=reuse_extra(store())),
                       {"image": 320})
    assert ecc.output_cols(config) == get_encoder_output_width(
        config, "image") == 320


def test_without_a_measurement_the_deepstack_width_is_computed(model_dir):
    # A consumer, or a vLLM that does not measure: computed from the
    # configuration as Qwen3-VL's vision tower makes it.
    config = real_config(model_dir, role="ec_consumer")
    assert not config.ec_transfer_config.mm_encoder_output_widths
    with pytest.raises(ValueError):
        get_encoder_output_width(config, "image")
    assert ecc.deepstack_cols(config.model_config.hf_config) == \
        QWEN3_VL_WIDTH
    assert ecc.output_cols(config) == QWEN3_VL_WIDTH


def test_a_model_without_deepstack_plans_its_embedding_size(
        plain_model_dir, store):
    config = real_config(plain_model_dir, role="ec_consumer")
    assert ecc.deepstack_cols(config.model_config.hf_config) is None
    assert ecc.output_cols(config) == \
        config.model_config.get_inputs_embeds_size() == tiny_vlm.PLAIN_HIDDEN
    # measured for another modality only: not the image's width
    config = _measured(real_config(plain_model_dir,
                                   extra=reuse_extra(store())),
                       {"video": 200})
    assert ecc.output_cols(config) == tiny_vlm.PLAIN_HIDDEN


def test_encoder_output_width_still_overrides(model_dir, store):
    config = _measured(real_config(model_dir, extra=reuse_extra(
        store(), encoder_output_width=100)), {"image": QWEN3_VL_WIDTH})
    assert _planned_cols(config) == 100
