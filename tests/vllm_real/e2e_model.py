# SPDX-License-Identifier: Apache-2.0
"""A tiny LLaVA-1.5-style checkpoint directory, written locally, for the
end-to-end run on the CPU (scripts/vllm-e2e.sh, test_e2e.py).

No file is downloaded and no weight is written: vLLM loads the model with
load_format="dummy" (random weights, seeded by vLLM itself).  What is
written: config.json (a CLIP vision tower of hidden size 64, 2 layers,
56-pixel images in 14-pixel patches, so 16 image embeddings; a Llama
language model of hidden size 128, 2 layers, 256 tokens), a one
character per token WordLevel tokenizer built with `tokenizers`
(`<image>` is token 4), generation_config.json, and the processor's
preprocessor_config.json and processor_config.json (LlavaProcessor over
CLIPImageProcessor).

    python e2e_model.py DIR      # writes DIR, prints its image token id
"""

from __future__ import annotations

import json
import os
import sys

IMAGE_SIZE = 56
PATCH = 14
# (IMAGE_SIZE // PATCH) ** 2 patches; the CLS token is dropped
# (vision_feature_select_strategy "default").
IMAGE_TOKENS = (IMAGE_SIZE // PATCH) ** 2
TEXT_HIDDEN = 128
VOCAB = 256
SPECIALS = ["<unk>", "<s>", "</s>", "<pad>", "<image>"]


def write_model(out: str) -> int:
    """Writes the checkpoint directory `out`; returns the image token id."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    os.makedirs(out, exist_ok=True)
    vocab: dict[str, int] = {}
    for t in SPECIALS:
        vocab[t] = len(vocab)
    for c in [chr(i) for i in range(32, 127)] + ["\n"]:
        vocab.setdefault(c, len(vocab))
    assert len(vocab) <= VOCAB
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    tok.add_special_tokens(SPECIALS)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>",
        eos_token="</s>", pad_token="<pad>")
    fast.add_special_tokens({"additional_special_tokens": ["<image>"]})
    fast.chat_template = (
        "{% for m in messages %}{{ m['role'] }}: "
        "{% if m['content'] is string %}{{ m['content'] }}"
        "{% else %}{% for c in m['content'] %}"
        "{% if c['type'] in ['image','image_url'] %}<image>\n"
        "{% elif c['type'] == 'text' %}{{ c['text'] }}{% endif %}"
        "{% endfor %}{% endif %}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant: {% endif %}")
    fast.save_pretrained(out)
    image_id = fast.convert_tokens_to_ids("<image>")

    cfg = {
        "architectures": ["LlavaForConditionalGeneration"],
        "model_type": "llava",
        "image_token_index": image_id, "image_token_id": image_id,
        "projector_hidden_act": "gelu",
        "vision_feature_select_strategy": "default",
        "vision_feature_layer": -2, "torch_dtype": "float32",
        "tie_word_embeddings": False,
        "text_config": {
            "model_type": "llama", "vocab_size": VOCAB,
            "hidden_size": TEXT_HIDDEN, "intermediate_size": 256,
            "num_hidden_layers": 2, "num_attention_heads": 2,
            "num_key_value_heads": 2, "max_position_embeddings": 2048,
            "rms_norm_eps": 1e-5, "hidden_act": "silu",
            "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 3,
            "torch_dtype": "float32"},
        "vision_config": {
            "model_type": "clip_vision_model", "hidden_size": 64,
            "intermediate_size": 128, "num_hidden_layers": 2,
            "num_attention_heads": 2, "image_size": IMAGE_SIZE,
            "patch_size": PATCH, "projection_dim": 64,
            "hidden_act": "quick_gelu", "num_channels": 3,
            "layer_norm_eps": 1e-5},
    }
    _dump(out, "config.json", cfg)
    _dump(out, "generation_config.json", {"bos_token_id": 1, "eos_token_id": 2})
    _dump(out, "preprocessor_config.json", {
        "image_processor_type": "CLIPImageProcessor",
        "processor_class": "LlavaProcessor",
        "crop_size": {"height": IMAGE_SIZE, "width": IMAGE_SIZE},
        "size": {"shortest_edge": IMAGE_SIZE},
        "do_center_crop": True, "do_resize": True, "do_rescale": True,
        "do_normalize": True, "do_convert_rgb": True, "resample": 3,
        "rescale_factor": 1 / 255,
        "image_mean": [0.48145466, 0.4578275, 0.40821073],
        "image_std": [0.26862954, 0.26130258, 0.27577711]})
    _dump(out, "processor_config.json", {
        "processor_class": "LlavaProcessor", "patch_size": PATCH,
        "vision_feature_select_strategy": "default",
        "num_additional_image_tokens": 1, "image_token": "<image>"})
    return image_id


def _dump(out: str, name: str, obj) -> None:
    with open(os.path.join(out, name), "w") as f:
        json.dump(obj, f, indent=1)


def images(n: int = 3, seed: int = 0):
    """n distinct RGB images of random pixels (NumPy, seeded), of
    different sizes: the processor resizes and crops each to 56x56."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    sizes = [(56, 56), (80, 60), (64, 72), (96, 96)]
    return [Image.fromarray(
        rng.integers(0, 256, (h, w, 3), dtype=np.uint8), "RGB")
        for w, h in (sizes[i % len(sizes)] for i in range(n))]


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: e2e_model.py DIR")
    print(f"e2e_model: wrote {sys.argv[1]}, image token "
          f"{write_model(sys.argv[1])}")
