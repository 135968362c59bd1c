# SPDX-License-Identifier: Apache-2.0
"""E2ECaptureConnector: vLLM's ECExampleConnector (delivery through files
under shared_storage_path) that also records what it is handed, for the
end-to-end run on the CPU (test_e2e.py).

On the encoders it is EncacheECConnector's inner connector
("inner_ec_connector": "E2ECaptureConnector",
"inner_ec_connector_module_path": "e2e_capture"): the connector that
delivers the encoder's outputs onwards, so what it is handed is what the
encoder "hands on".  On the consumer it is the connector itself.

Recorded in $ENCACHE_E2E_CAPTURE (a directory), one file per event, the
tensor as vLLM passed it, in safetensors (key "t"), and one JSON line
per event in events.jsonl, in the order of the calls:

- "hit": an identifier found in the encoder cache at start_save_caches
  that this process never encoded: EncacheECConnector put it there from
  the Store, before calling this hook (connector.py: the lookup, then the
  inner connector).  It is delivered at once, by ECExampleConnector's own
  save_caches (the file the consumer reads), as ECMooncakeConnector binds
  the hits it finds in the encoder cache as push sources in its
  start_save_caches.
- "encoded": save_caches, which vLLM calls for each output its encoder
  computed (V1: gpu_model_runner.py, _cache_encoder_output; V2:
  gpu/ec_connector.py, for the new keys only).  Delivered by
  ECExampleConnector's save_caches unless the identifier was already
  delivered as a hit (each identifier is delivered once, the hit's bits).
- "loaded": on a consumer, each identifier start_load_caches put in the
  encoder cache (ECExampleConnector read it from the producer's file).
"""

from __future__ import annotations

import json
import os

from vllm.distributed.ec_transfer.ec_connector.example_connector import (
    ECExampleConnector)


class E2ECaptureConnector(ECExampleConnector):

    def __init__(self, vllm_config, role):
        super().__init__(vllm_config, role)
        self._capture = os.environ.get("ENCACHE_E2E_CAPTURE")
        self._encoded: set[str] = set()
        self._delivered: set[str] = set()
        self._seq = 0

    def _record(self, kind: str, mm_hash: str, tensor) -> None:
        if not self._capture:
            return
        import safetensors.torch

        os.makedirs(self._capture, exist_ok=True)
        self._seq += 1
        name = f"{os.getpid()}-{self._seq:04d}-{kind}.safetensors"
        t = tensor.detach().to("cpu").contiguous()
        safetensors.torch.save_file({"t": t},
                                    os.path.join(self._capture, name))
        with open(os.path.join(self._capture, "events.jsonl"), "a") as f:
            f.write(json.dumps({
                "pid": os.getpid(), "seq": self._seq, "kind": kind,
                "mm_hash": mm_hash, "file": name, "shape": list(t.shape),
                "dtype": str(t.dtype)}) + "\n")

    def start_save_caches(self, **kwargs) -> None:
        encoder_cache = kwargs.get("encoder_cache") or {}
        for mm_hash, tensor in list(encoder_cache.items()):
            if mm_hash in self._encoded or mm_hash in self._delivered:
                continue
            self._record("hit", mm_hash, tensor)
            ECExampleConnector.save_caches(self, encoder_cache, mm_hash)
            self._delivered.add(mm_hash)
        return super().start_save_caches(**kwargs)

    def save_caches(self, encoder_cache, mm_hash, **kwargs) -> None:
        self._encoded.add(mm_hash)
        self._record("encoded", mm_hash, encoder_cache[mm_hash])
        if mm_hash in self._delivered:
            return
        self._delivered.add(mm_hash)
        super().save_caches(encoder_cache, mm_hash, **kwargs)

    def start_load_caches(self, encoder_cache, **kwargs) -> None:
        before = set(encoder_cache)
        super().start_load_caches(encoder_cache, **kwargs)
        for mm_hash in [k for k in encoder_cache if k not in before]:
            self._record("loaded", mm_hash, encoder_cache[mm_hash])
