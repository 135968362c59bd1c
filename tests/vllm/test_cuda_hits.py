# SPDX-License-Identifier: Apache-2.0
"""Hits go straight into the encoder cache on the worker's CUDA device,
through encache's device path, on the fake CUDA runtime of the Python
suite (tests/python/test_cuda.py: Debian's torch has no CUDA, so the
device outputs are its DeviceArrays over the fake's device memory)."""
import os

import pytest

import vllm_fakes as vf
from test_cuda import DeviceArray, fake  # noqa: F401 (the autouse fixture)

LIB = os.environ.get("ENCACHE_CUDA_LIBRARY", "")
pytestmark = pytest.mark.skipif(
    "fakecudart" not in os.path.basename(LIB),
    reason="needs ENCACHE_CUDA_LIBRARY naming the fake CUDA runtime")


def test_hits_land_on_the_workers_device(engines, shm):
    url = shm()
    a = engines(vf.vllm_config(url))
    a.step([vf.request("r1", ["A", "B"])])
    a.worker.shutdown()
    b = engines(vf.VllmConfig(vf.vllm_config(url).ec_transfer_config,
                              device="cuda:0"))
    b.step([vf.request("r2", ["A", "B"])])
    assert b.encoder.calls == []
    for k in "AB":
        got = b.encoder_cache[k]
        assert isinstance(got, DeviceArray)
        assert got.host().tobytes() == a.encoder_cache[k].numpy().tobytes()
    assert b.worker.core.stats().device_bytes_copied == 2 * 4 * 8 * 4


def test_cuda_without_an_index_is_the_workers_current_gpu(engines, shm,
                                                         monkeypatch):
    # vLLM's device_config says "cuda"; each worker has made its GPU
    # current (encache's own "cuda" would be GPU 0).
    import torch
    asked = []
    monkeypatch.setattr(torch.cuda, "current_device",
                        lambda: asked.append(1) or 0)
    url = shm()
    a = engines(vf.vllm_config(url))
    a.step([vf.request("r1", ["A"])])
    a.worker.shutdown()
    b = engines(vf.VllmConfig(vf.vllm_config(url).ec_transfer_config,
                              device="cuda"))
    assert b.worker.core.device == "cuda"
    b.step([vf.request("r2", ["A"])])
    assert asked and isinstance(b.encoder_cache["A"], DeviceArray)
