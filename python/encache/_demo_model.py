# SPDX-License-Identifier: Apache-2.0
"""The encoder of ``python3 -m encache.demo``: a torchvision VisionTransformer.

Its weights come from a fixed seed (nothing is downloaded), so it is a real
vision transformer that computes real embeddings, but not a trained one.
The embedding of an image is the encoder's output token matrix: one row a
token (the class token first, then one a patch), one column a hidden unit.
Images are encoded one at a time (batch 1) with one thread, so that the
same image always gives the same bits, in every encoder process.
"""
from dataclasses import dataclass

import numpy as np

# ImageNet's normalisation, as torchvision's ViT presets use.
_MEAN = (0.485, 0.456, 0.406)
_STD = (0.229, 0.224, 0.225)

WEIGHT_SEED = 0  # torch.manual_seed before the weights are initialised


@dataclass(frozen=True)
class ModelSpec:
    """A VisionTransformer configuration (picklable, sent to the encoders)."""

    layers: int = 2
    hidden: int = 384
    patch: int = 32
    image_size: int = 224

    @property
    def heads(self):
        return max(1, self.hidden // 64)

    @property
    def mlp(self):
        return 4 * self.hidden

    @property
    def tokens(self):
        return (self.image_size // self.patch) ** 2 + 1

    def name(self):
        """The model name of the cache's namespace: one per configuration."""
        return ("encache-pydemo/vit-i%d-p%d-l%d-h%d-seed%d"
                % (self.image_size, self.patch, self.layers, self.hidden,
                   WEIGHT_SEED))

    def describe(self):
        return ("torchvision VisionTransformer (image %d, patch %d, %d "
                "layer%s, %d heads, hidden %d, MLP %d), weights initialised "
                "from seed %d (not downloaded, not trained)"
                % (self.image_size, self.patch, self.layers,
                   "s"[:self.layers > 1], self.heads, self.hidden, self.mlp,
                   WEIGHT_SEED))

    def as_dict(self):
        return {"class": "torchvision.models.VisionTransformer",
                "image_size": self.image_size, "patch_size": self.patch,
                "num_layers": self.layers, "num_heads": self.heads,
                "hidden_dim": self.hidden, "mlp_dim": self.mlp,
                "weights": "initialised from seed %d, not downloaded, "
                           "not trained" % WEIGHT_SEED,
                "tokens": self.tokens}


def check_spec(spec):
    """None when spec can be built, else why not (for a usage error)."""
    if spec.layers < 1 or spec.layers > 48:
        return "--model-layers: must be from 1 to 48"
    if spec.hidden < 64 or spec.hidden % 64 != 0 or spec.hidden > 4096:
        return "--model-hidden: must be a multiple of 64 from 64 to 4096"
    if spec.patch not in (8, 14, 16, 28, 32, 56, 112, 224):
        return "--patch: must divide 224 (8, 14, 16, 28, 32, 56, 112 or 224)"
    return None


class Encoder:
    """The VisionTransformer of spec, built in this process."""

    def __init__(self, spec, dtype):
        import torch
        from torchvision.models import VisionTransformer

        self.torch = torch
        self.spec = spec
        self.dtype = dtype
        torch.manual_seed(WEIGHT_SEED)
        self.model = VisionTransformer(
            image_size=spec.image_size, patch_size=spec.patch,
            num_layers=spec.layers, num_heads=spec.heads,
            hidden_dim=spec.hidden, mlp_dim=spec.mlp).eval()
        self.mean = torch.tensor(_MEAN).view(1, 3, 1, 1)
        self.std = torch.tensor(_STD).view(1, 3, 1, 1)
        # A first encode pays for one-time allocations: not the runs'.
        self.encode(np.zeros((spec.patch, spec.patch, 3), dtype=np.uint8))

    def encode(self, pixels):
        """The output tokens (tokens x hidden, self.dtype) of one image
        (an H x W x 3 uint8 array): resized, normalised, encoded."""
        torch = self.torch
        size = (self.spec.image_size, self.spec.image_size)
        x = torch.from_numpy(pixels).permute(2, 0, 1).unsqueeze(0)
        x = x.to(torch.float32).div_(255.0)
        x = torch.nn.functional.interpolate(x, size=size, mode="bilinear",
                                            align_corners=False)
        x = (x - self.mean) / self.std
        m = self.model
        with torch.inference_mode():
            h = m._process_input(x)
            h = torch.cat([m.class_token.expand(1, -1, -1), h], dim=1)
            h = m.encoder(h)
        return h[0].to(self.dtype).contiguous()
