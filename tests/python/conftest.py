# SPDX-License-Identifier: Apache-2.0
"""Fixtures of the Python suite: fresh shm Stores destroyed after each test,
Caches closed after it, the fault-injecting Store reset around it, and the
figures a test measures, printed at the end of the run."""
import pytest
import torch

import ectest
from ectest import fault_fixture, shm  # noqa: F401 (fixtures)

torch.set_num_threads(1)

FIGURES = []


@pytest.fixture
def figure():
    """figure(name, text): a measured figure, shown in the run's summary."""
    return lambda name, text: FIGURES.append(f"{name}: {text}")


def pytest_terminal_summary(terminalreporter):
    if FIGURES:
        terminalreporter.section("figures")
        for line in FIGURES:
            terminalreporter.write_line(line)


@pytest.fixture
def store(shm):
    """The URL of this test's shm Store."""
    return shm()


@pytest.fixture
def open_cache(store):
    """open_cache(url=None, model=..., dtype=..., **kw): an encache.Cache on
    `store` (or url), reuse on; all are closed after the test (a poisoned
    one's error is expected there)."""
    opened = []

    def make(url=None, **kw):
        cache = ectest.open_cache(url or store, **kw)
        opened.append(cache)
        return cache

    yield make
    ectest.reset_fault()  # nothing held may keep a close waiting
    for cache in opened:
        try:
            cache.close()
        except ectest.encache.Error:
            pass
