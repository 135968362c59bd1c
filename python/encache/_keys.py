# SPDX-License-Identifier: Apache-2.0
"""The encoder field of a key as vLLM computes it (docs/format.md).

vLLM's build_embedding_namespace() writes multimodal_config.compute_hash():
MD5 (vllm/utils/hashing.py safe_hash, usedforsecurity=False) of Python's
str() of a factor list.  The lists that have shipped, by vLLM file and
commit (docs/compatibility.md):

  1: [backend]  vllm/config/multimodal.py at
     01230b40128e570a58e54e75f7e55c4d5cd9246d
  2: [backend, mm_encoder_tp_mode]  the same file at
     55e847c01c4b10736b55f091531717e18c579817
  4: [backend, mm_encoder_tp_mode, mm_encoder_attn_dtype,
     mm_encoder_fp8_scale_path]  the newest (the hash changes with the
     last two in tests/config/test_multimodal_config.py at
     0643a87f08da57b090e989aa25bc3d203123d8bd); the default

The C library computes the same (encache_vllm_mm_hash()), and so does
`encache key --vllm-mm-*`; tests/vllm_vectors.json holds the vectors all
three are checked against.
"""

import hashlib
import typing

FACTOR_LISTS = (1, 2, 4)


def vllm_encoder_hash(tp_mode: str = "weights",
                      attn_backend: typing.Optional[str] = None,
                      attn_dtype: typing.Optional[str] = None,
                      fp8_scale_path: typing.Optional[str] = None,
                      factors: typing.Union[int, str] = "newest") -> str:
    """The encoder field vLLM writes for a multimodal model whose
    multimodal config has these fields (each default is vLLM's): 32 hex
    digits, for Cache(encoder_hash=...).  `factors` names the factor list
    of the vLLM next to you: "newest" (= 4), 2 or 1.  Raises ValueError
    for an unknown list or tp_mode."""
    if factors == "newest":
        factors = 4
    if factors not in FACTOR_LISTS or isinstance(factors, bool):
        raise ValueError(f"factors must be 1, 2, 4 or 'newest', got "
                         f"{factors!r}")
    if tp_mode not in ("weights", "data"):
        raise ValueError(f"tp_mode must be 'weights' or 'data' (vLLM's "
                         f"mm_encoder_tp_mode), got {tp_mode!r}")
    # vLLM: AttentionBackendEnum[value.upper()], then .name.
    backend = attn_backend.upper() if attn_backend else None
    lists = {1: [backend], 2: [backend, tp_mode],
             4: [backend, tp_mode, attn_dtype, fp8_scale_path]}
    return hashlib.md5(str(lists[factors]).encode(),
                       usedforsecurity=False).hexdigest()
