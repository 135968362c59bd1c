# SPDX-License-Identifier: Apache-2.0
"""encache.purge(): a namespace's objects counted, then removed, and
nothing of another namespace touched (as `encache purge`)."""
import pytest

import ectest
from ectest import F32, encache


def test_purge_removes_its_namespace_only(open_cache, store):
    old = open_cache(model="org/old")
    new = open_cache(model="org/new")
    for c in (old, new):
        for i in ("a", "b"):
            ectest.publish_one(c, i, ectest.sample(2, 2))
    count = encache.purge(store, old.namespace, dry_run=True)
    assert count[0] == 2 and count[1] > 0
    assert encache.purge(store, old.namespace) == (2, None)
    assert encache.purge(store, old.namespace, dry_run=True) == (0, 0)
    assert not ectest.lookup_one(old, "a", F32, (2, 2)).hit
    assert ectest.lookup_one(new, "a", F32, (2, 2)).hit


def test_purge_errors():
    with pytest.raises(encache.UrlError):
        encache.purge("bogus://x", "ns")
    with pytest.raises(encache.InvalidError):
        encache.purge("shm://x?size=1MiB", "")
