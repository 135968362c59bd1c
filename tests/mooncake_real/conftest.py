# SPDX-License-Identifier: Apache-2.0
"""Fixtures of the real-Mooncake suite (tests/mooncake_real.sh runs it):
a Mooncake Store from Mooncake's wheel (MOONCAKE_CONFIG_PATH names its
client JSON), reached through whatever route this Python has, and the
helpers of the Python suite (tests/python/ectest.py)."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))

import ectest  # noqa: E402
from ectest import shm  # noqa: E402,F401 (fixture)


@pytest.fixture
def mooncake():
    """The Store URL of the real Mooncake Store."""
    if not os.environ.get("MOONCAKE_CONFIG_PATH"):
        pytest.skip("MOONCAKE_CONFIG_PATH is not set (tests/mooncake_real.sh "
                    "starts a Mooncake Store and sets it)")
    return "mooncake:"


@pytest.fixture
def open_cache(mooncake):
    """open_cache(url=None, **kw): an encache.Cache on the Mooncake Store
    (or url), reuse on; all are closed after the test."""
    opened = []

    def make(url=None, **kw):
        cache = ectest.open_cache(url or mooncake, **kw)
        opened.append(cache)
        return cache

    yield make
    for cache in opened:
        try:
            cache.close()
        except ectest.encache.Error:
            pass
