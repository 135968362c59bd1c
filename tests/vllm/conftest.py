# SPDX-License-Identifier: Apache-2.0
"""Fixtures of the vLLM connector's contract suite (tests/vllm, run by
tests/vllm/run.sh): the Python suite's helpers (tests/python/ectest.py),
fresh shm Stores destroyed after each test, the fault-injecting Store, and
engines shut down after the test."""
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
sys.path.insert(0, os.path.dirname(__file__))

import ectest  # noqa: E402
from ectest import fault_fixture, shm  # noqa: E402,F401 (fixtures)

torch.set_num_threads(1)


@pytest.fixture
def engines():
    """engines(config): a vllm_fakes.Engine, shut down after the test (a
    poisoned one's error is expected there)."""
    import vllm_fakes
    made = []

    def make(config):
        e = vllm_fakes.Engine(config)
        made.append(e)
        return e

    yield make
    ectest.reset_fault()
    for e in made:
        try:
            e.shutdown()
        except ectest.encache.Error:
            pass
