# SPDX-License-Identifier: Apache-2.0
"""The smallest real model configurations vLLM accepts as multimodal, with
no weights and no image processor: a Qwen3-VL configuration (transformers'
Qwen3VLConfig: a 64-wide language model, a vision tower whose
out_hidden_size is 64 with two DeepStack layers), and a Qwen2-VL one
(96 wide, no DeepStack), under an architecture of our own,
TinyDeepStackVLM, registered with vLLM's ModelRegistry.  vLLM's
own Qwen3-VL class cannot be used here: its module imports torchvision,
which the contract's environment does not have (scripts/vllm-venv.sh).
vLLM reads the configuration, the architecture's interfaces
(SupportsMultiModal: a multimodal_config is made) and nothing else; no
model is loaded."""

import json
import os

from torch import nn

from vllm import ModelRegistry
from vllm.model_executor.models.interfaces import SupportsMultiModal

ARCH = "TinyDeepStackVLM"
TEXT_HIDDEN = 64          # get_inputs_embeds_size()
VISION_OUT = 64           # vision_config.out_hidden_size
DEEPSTACK = [0, 1]        # vision_config.deepstack_visual_indexes


class TinyDeepStackVLM(nn.Module, SupportsMultiModal):
    supports_multimodal = True
    # so that mm_encoder_tp_mode "data" and mm_device_do_normalize hold
    # (they are factors of MultiModalConfig.compute_hash())
    supports_encoder_tp_data = True
    supports_mm_device_do_normalize = True

    def __init__(self, *, vllm_config, prefix=""):
        super().__init__()

    @classmethod
    def get_placeholder_str(cls, modality, i):
        return "<|image_pad|>"

    def forward(self, input_ids, positions, intermediate_tensors=None,
                inputs_embeds=None):
        raise NotImplementedError("a configuration only")

    def compute_logits(self, hidden_states):
        raise NotImplementedError("a configuration only")


def register() -> None:
    if ARCH not in ModelRegistry.get_supported_archs():
        ModelRegistry.register_model(ARCH, TinyDeepStackVLM)


def write(directory: str) -> str:
    """Writes the Qwen3-VL configuration (DeepStack) into directory."""
    from transformers import Qwen3VLConfig
    vision = dict(depth=3, hidden_size=32, intermediate_size=64, num_heads=2,
                  out_hidden_size=VISION_OUT, patch_size=16,
                  spatial_merge_size=2, temporal_patch_size=2,
                  num_position_embeddings=64,
                  deepstack_visual_indexes=DEEPSTACK)
    text = dict(hidden_size=TEXT_HIDDEN, intermediate_size=128,
                num_hidden_layers=2, num_attention_heads=2,
                num_key_value_heads=1, head_dim=32, vocab_size=256,
                max_position_embeddings=512,
                rope_scaling={"rope_type": "default",
                              "mrope_section": [8, 4, 4],
                              "mrope_interleaved": True})
    return _save(Qwen3VLConfig(text_config=text, vision_config=vision),
                 directory)


PLAIN_HIDDEN = 96  # the Qwen2-VL one's get_inputs_embeds_size()


def write_plain(directory: str) -> str:
    """Writes a Qwen2-VL configuration (no DeepStack) into directory:
    another model, whose encoder outputs are as wide as its embeddings."""
    from transformers import Qwen2VLConfig
    text = dict(hidden_size=PLAIN_HIDDEN, intermediate_size=128,
                num_hidden_layers=2, num_attention_heads=2,
                num_key_value_heads=1, vocab_size=151700,
                rope_scaling={"rope_type": "default",
                              "mrope_section": [8, 8, 8]})
    vision = dict(depth=2, embed_dim=32, hidden_size=PLAIN_HIDDEN,
                  num_heads=2, patch_size=14, spatial_merge_size=2)
    return _save(Qwen2VLConfig(text_config=text, vision_config=vision),
                 directory)


def _save(cfg, directory):
    cfg.architectures = [ARCH]
    os.makedirs(directory, exist_ok=True)
    cfg.save_pretrained(directory)
    with open(os.path.join(directory, "config.json")) as f:
        assert json.load(f)["architectures"] == [ARCH]
    return directory
