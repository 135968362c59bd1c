# SPDX-License-Identifier: Apache-2.0
"""Errors: each library failure raises its class, with the library's code,
name and message; bad items are InvalidError (a ValueError); a closed Cache
or Step raises ClosedError; at most ENCACHE_MAX_STEPS steps are open."""
import gc

import pytest

import encache
import ectest
from ectest import F32, sample

MAX_STEPS = 64  # ENCACHE_MAX_STEPS


@pytest.mark.parametrize("field,value", [
    ("store_max_pending_items", 0),
    ("store_read_buffer_bytes", "lots"),
    ("cross_encoder_cache", "yes"),
])
def test_config_error_names_the_field(store, field, value):
    cfg = ectest.config(**{field: value})
    with pytest.raises(encache.ConfigError) as e:
        ectest.open_cache(store, ec_transfer_config=cfg)
    err = e.value
    assert isinstance(err, encache.Error) and not isinstance(err,
                                                             encache.JsonError)
    assert err.code == -30600 and err.name == "ECONFIG"
    assert err.field is not None and err.field.endswith(field), err.field
    assert field in str(err)


def test_config_error_from_typed_options(store):
    with pytest.raises(encache.ConfigError) as e:
        ectest.open_cache(store, options={"cross_encoder_cache": True,
                                          "store_max_pending_bytes": 0})
    assert e.value.field.endswith("store_max_pending_bytes"), e.value.field


def test_json_error(store):
    with pytest.raises(encache.JsonError) as e:
        ectest.open_cache(store, ec_transfer_config='{"ec_connector_extra_'
                          'config": {"cross_encoder_cache": true,')
    assert isinstance(e.value, encache.ConfigError)
    assert e.value.name == "EJSON" and e.value.code == -30601


@pytest.mark.parametrize("url", ["nosuchscheme://x", "", "shm://?size=1MiB",
                                 "redis://127.0.0.1:notaport"])
def test_url_error(url):
    with pytest.raises(encache.UrlError) as e:
        ectest.open_cache(url)
    assert e.value.name == "EURL" and e.value.code == -30613


@pytest.mark.parametrize("item", [
    ("x", "float64", (2, 2)),
    ("x", "nonsense", (2, 2)),
    ("x", F32, (1,)),
    ("x", F32, (2, 2, 2)),
    ("x", F32, (-1, 2)),
    ("x", F32, ("2", 2)),
    (5, F32, (2, 2)),
    (b"x", F32, (2, 2)),
    ("x",),
], ids=repr)
def test_invalid_items(open_cache, item):
    c = open_cache()
    with pytest.raises(encache.InvalidError) as e:
        c.lookup([item])
    assert isinstance(e.value, ValueError) and isinstance(e.value,
                                                          encache.Error)
    # The Cache is unharmed, and no step was left open by the failure.
    gc.collect()
    assert c.stats().steps_open == 0
    assert ectest.lookup_one(c, "ok", F32, (2, 2)).outcome \
        == encache.Outcome.MISS


def test_closed_cache_and_step(store):
    with ectest.open_cache(store) as c:
        step = c.lookup([("x", F32, (2, 2))])
    for call in (lambda: c.lookup([("x", F32, (2, 2))]), c.step, c.flush,
                 lambda: step.publish("x", sample(2, 2)),
                 lambda: step.lookup([("y", F32, (2, 2))])):
        with pytest.raises(encache.ClosedError) as e:
            call()
        assert e.value.name == "ECLOSED"
    c.close()  # idempotent
    step.close()


def test_too_many_steps(open_cache):
    c = open_cache()
    steps = [c.step() for _ in range(MAX_STEPS)]
    assert c.stats().steps_open == MAX_STEPS
    with pytest.raises(encache.StepsError) as e:
        c.step()
    assert e.value.name == "ESTEPS"
    with pytest.raises(encache.StepsError):
        c.lookup([("x", F32, (2, 2))])
    steps.pop().close()
    with c.step() as s:
        s.lookup([("x", F32, (2, 2))])
        assert s.results[0].outcome == encache.Outcome.MISS
    for s in steps:
        s.close()
    assert c.stats().steps_open == 0


def test_error_hierarchy():
    assert issubclass(encache.JsonError, encache.ConfigError)
    assert issubclass(encache.FormatError, encache.StoreError)
    assert issubclass(encache.OutOfMemoryError, MemoryError)
    for name in ("ConfigError", "UrlError", "StoreError", "LibraryError",
                 "PoisonedError", "ClosedError", "StepsError",
                 "InvalidError", "ForkError"):
        assert issubclass(getattr(encache, name), encache.Error), name


def test_dropped_steps_are_closed(open_cache):
    """A Step nobody holds is closed when it is collected: dropping more
    than MAX_STEPS of them never runs out of steps."""
    c = open_cache()
    for i in range(2 * MAX_STEPS):
        c.lookup([(f"x{i}", F32, (2, 2))])
    gc.collect()
    assert c.stats().steps_open == 0
