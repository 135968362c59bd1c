# SPDX-License-Identifier: Apache-2.0
"""The Python package on a real GPU (scripts/gpu-check.sh runs it when
torch has CUDA): a CUDA tensor published, changed on its stream right
after (what is written is its value at the publish call), then read back
into CUDA tensors by another Cache and into a CPU tensor.  Prints what it
checked; exits 1 at the first difference."""
import os
import sys

import torch

import encache

name = f"encache-gpucheck-{os.getpid()}"
url = f"shm://{name}?size=256MiB"
config = {"ec_connector": "ECMooncakeConnector", "ec_role": "ec_producer",
          "ec_connector_extra_config": {"cross_encoder_cache": True}}
F = torch.bfloat16


def cache():
    return encache.Cache(ec_transfer_config=config, model="gpu/check",
                         dtype=F, store=url)


def main():
    dev = torch.device("cuda", 0)
    rows, cols = 1024, 2048  # 4 MiB of bfloat16
    out = torch.randn(rows, cols, device=dev).to(F)
    want = out.cpu()
    a, b = cache(), cache()
    try:
        with a.lookup([("x", F, (rows, cols), dev)]) as step:
            assert step[0].outcome == encache.Outcome.MISS, step[0]
            assert step.publish("x", out) == encache.Skip.QUEUED
            out.add_(1)  # queued after the publish's copy on this stream
        a.flush()
        st = a.stats()
        assert st.published_written == 1 and st.device_published == 1, st
        with b.lookup([("x", F, (rows, cols), dev),
                       ("x", F, (rows, cols), "cpu")]) as step:
            on_gpu, on_cpu = step
            assert on_gpu.hit and on_gpu.tensor.is_cuda, on_gpu
            assert on_gpu.tensor.data_ptr() == on_gpu.address
            assert torch.equal(on_gpu.tensor.cpu().view(torch.int16),
                               want.view(torch.int16)), "device hit differs"
            assert torch.equal(on_cpu.tensor.view(torch.int16),
                               want.view(torch.int16)), "host hit differs"
        print(f"python: a {rows}x{cols} bfloat16 CUDA tensor published and "
              f"read back into cuda:0 and the CPU, bit for bit; "
              f"device_bytes_copied={b.stats().device_bytes_copied}")
    finally:
        a.close()
        b.close()
        encache.shm_destroy(name)


if __name__ == "__main__":
    if not torch.cuda.is_available():
        print("skipped: torch has no CUDA here")
        sys.exit(0)
    main()
