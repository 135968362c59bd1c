# SPDX-License-Identifier: Apache-2.0
"""Encoder processes of tests/vllm (spawned: a fresh interpreter, as vLLM's
workers are): each runs an Engine over a Store URL and reports what it
encoded and the bits of its encoder cache."""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))


def encoder_process(url, images, conn):
    import vllm_fakes as vf
    e = vf.Engine(vf.vllm_config(url))
    try:
        e.step([vf.request("r-" + "-".join(images), images)])
        bits = {k: v.view(-1).view(__import__("torch").int32).tolist()
                for k, v in e.encoder_cache.items()}
        conn.send((list(e.encoder.calls), bits))
    finally:
        e.shutdown()  # waits for the publications
        conn.close()
