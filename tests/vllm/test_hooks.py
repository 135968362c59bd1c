# SPDX-License-Identifier: Apache-2.0
"""The connector's per-step hooks in C (python/_encache/vllm_hooks.c:
ConnectorHooks and WorkerStep): the arguments vLLM's model runner passes
them, what they forward to the inner connector, the rare cases they hand to
Python, bad input, and no reference left behind by a step."""

import abc
import contextlib
import gc
import pickle
import sys
import weakref

import pytest
import torch

import encache
import vllm_fakes as vf
from encache.vllm import _core
from encache.vllm import connector as ecc


class KwargsDelivery(ecc.ECConnectorBase):
    """An inner connector that records what its hooks receive."""

    def __init__(self, vllm_config, role):
        super().__init__(vllm_config, role)
        self.calls = []

    def bind_connector_metadata(self, m):
        self.calls.append(("bind", m))

    def start_save_caches(self, encoder_cache=None, **kw):
        self.calls.append(("start_save_caches", set(encoder_cache), kw))

    def clear_connector_metadata(self):
        self.calls.append(("clear",))

    def start_load_caches(self, encoder_cache, **kw):
        pass

    def save_caches(self, encoder_cache, mm_hash, **kw):
        pass

    def has_cache_item(self, identifier):
        return False

    def update_state_after_alloc(self, request, index):
        pass

    def build_connector_meta(self, scheduler_output):
        return "inner-meta"

    def only_the_inner_has_this(self):
        return "inner's"



def _pair(shm, inner="", **extra):
    config = vf.vllm_config(shm(), inner=inner, **extra)
    if inner:
        config.ec_transfer_config.ec_connector_extra_config[
            "inner_ec_connector_module_path"] = __name__
    s = ecc.EncacheECConnector(config, ecc.ECConnectorRole.SCHEDULER)
    w = ecc.EncacheECConnector(config, ecc.ECConnectorRole.WORKER)
    return s, w


@contextlib.contextmanager
def _connectors(shm, inner="", **extra):
    """_pair's two connectors, shut down at the end."""
    s, w = _pair(shm, inner, **extra)
    try:
        yield s, w
    finally:
        w.shutdown()
        s.shutdown()


def _publish(w, ids, rows=4):
    cache = w.core.cache
    hidden = vf.ModelConfig().get_hidden_size()
    items = [encache.Item(i, "float32", (rows, hidden)) for i in ids]
    with cache.lookup(items) as st:
        for n, i in enumerate(ids):
            st.publish(i, torch.full((rows, hidden), float(n)))
    cache.flush()


def _meta(s, ids, rows=4, tag="r1"):
    out = vf.SchedulerOutput([vf.NewRequestData(tag, vf.request(
        tag, ids, rows).mm_features)], {tag: list(range(len(ids)))}, set())
    return pickle.loads(pickle.dumps(s.build_connector_meta(out)))


def test_hooks_take_vllms_arguments_by_position_and_by_name(shm):
    with _connectors(shm) as (s, w):
        _publish(w, ["A", "B"])
        meta = _meta(s, ["A", "B"])
        for how in ("position", "name"):
            cache = {}
            if how == "position":
                w.bind_connector_metadata(meta)
                w.start_save_caches(cache)
            else:
                w.bind_connector_metadata(connector_metadata=meta)
                w.start_save_caches(encoder_cache=cache, extra=1)
            assert w._connector_metadata is meta
            assert set(cache) == {"A", "B"}
            assert torch.equal(cache["B"], torch.full_like(cache["B"], 1.0))
            w.clear_connector_metadata()
            assert w._connector_metadata is None
            assert not w.core.open and w.core.state.step is None
        assert w.core.counters.steps == 2
        assert w.core.counters.loaded == 4


@pytest.mark.parametrize("call, message", [
    (lambda w: w.bind_connector_metadata(), "takes one argument"),
    (lambda w: w.bind_connector_metadata(1, 2), "takes one argument"),
    (lambda w: w.bind_connector_metadata(metadata=1), "takes one argument"),
    (lambda w: w.start_save_caches({}, {}), "at most one positional"),
    (lambda w: w.start_save_caches({}, encoder_cache={}), "multiple values"),
    (lambda w: w.clear_connector_metadata(1), "takes no arguments"),
])
def test_hooks_refuse_calls_vllm_never_makes(shm, call, message):
    with _connectors(shm) as (s, w):
        with pytest.raises(TypeError, match=message):
            call(w)


def test_hooks_forward_to_the_inner_connector_with_its_metadata(shm):
    with _connectors(shm, inner="KwargsDelivery") as (s, w):
        _publish(w, ["A"])
        meta = _meta(s, ["A"])
        assert meta.inner == "inner-meta"
        cache = {}
        w.bind_connector_metadata(meta)
        w.start_save_caches(encoder_cache=cache, stream="s0")
        w.clear_connector_metadata()
        # The inner connector sees its own metadata, and the encoder cache
        # with the hit already in it, and every keyword given.
        assert w._inner.calls == [
            ("bind", "inner-meta"),
            ("start_save_caches", {"A"}, {"stream": "s0"}),
            ("clear",)]
        # Hooks this class does not define are the inner connector's;
        # dunders and what neither has are not.
        assert w.only_the_inner_has_this() == "inner's"
        with pytest.raises(AttributeError):
            w.neither_has_this
        with pytest.raises(AttributeError):
            w.__neither__


def test_a_rejected_lookup_is_encoded_instead(shm):
    with _connectors(shm) as (s, w):
        bad = ecc.EncacheECConnectorMetadata(_core.StepPlan((
            _core.Candidate("A", 4, 8, "float7"),)))
        cache = {}
        w.bind_connector_metadata(bad)
        w.start_save_caches(encoder_cache=cache)
        w.clear_connector_metadata()
        assert cache == {}
        assert w.core.counters.lookup_errors == 1


def test_the_rare_cases_take_pythons_path(shm):
    # An item already in the encoder cache, an encoder cache that is not a
    # plain dict, and a step opened before by save_caches: each is handed
    # to WorkerCore._begin_with, with the same hits.
    class Cache(dict):
        pass

    with _connectors(shm) as (s, w):
        _publish(w, ["A", "B"])
        meta = _meta(s, ["A", "B"])
        local = torch.zeros(1)
        for cache in ({"A": local}, Cache()):
            w.bind_connector_metadata(meta)
            w.start_save_caches(encoder_cache=cache)
            w.clear_connector_metadata()
            assert set(cache) == {"A", "B"}
        assert cache.__class__ is Cache
        assert w.core.counters.already_local == 1
        assert w.core.counters.loaded == 3


def test_a_step_left_open_is_closed_by_the_next_bind(shm):
    with _connectors(shm) as (s, w):
        _publish(w, ["A"])
        meta = _meta(s, ["A"])
        w.bind_connector_metadata(meta)
        w.start_save_caches(encoder_cache={})
        first = w.core.state.step
        assert first is not None and not first.closed
        w.bind_connector_metadata(meta)  # no clear: the runner left it open
        assert first.closed and not w.core.open
        cache = {}
        w.start_save_caches(encoder_cache=cache)
        assert set(cache) == {"A"}
        w.clear_connector_metadata()
        assert w.core.cache.stats().steps_open == 0


def test_worker_step_refuses_bad_state():
    with pytest.raises(encache.InvalidError, match="Cache or None"):
        encache._encache.WorkerStep("shm://x")
    with pytest.raises(encache.InvalidError, match="callables"):
        encache._encache.WorkerStep.__new__(encache._encache.WorkerStep)\
            .__init__(encache.Cache.__new__(encache.Cache), 1, 2)
    st = encache._encache.WorkerStep(None)
    with pytest.raises(encache.InvalidError, match="initialised once"):
        st.__init__(None)
    with pytest.raises(encache.InvalidError, match="Step or None"):
        st.step = 5
    with pytest.raises(encache.InvalidError, match="Cache or None"):
        st.cache = "x"
    with pytest.raises(TypeError):
        st.begin()
    # Without a Cache, a step does nothing but count.
    assert st.begin({}) == 0 and st.open and st.begin({}) == 0
    st.end()
    assert not st.open and st.steps == 1


def test_an_uninitialised_worker_step_raises():
    # WorkerStep.__new__ without __init__ (or one cleared by the GC) has no
    # state: each call raises instead of reading a NULL.
    st = encache._encache.WorkerStep.__new__(encache._encache.WorkerStep)
    for call in (st.end, st.clear, lambda: st.bind(None),
                 lambda: st.begin({}), lambda: st.cache,
                 lambda: setattr(st, "step", None)):
        with pytest.raises(RuntimeError, match="not initialised"):
            call()
    # handoffs=None is accepted, as documented; anything else not a dict
    # is refused.
    encache._encache.WorkerStep(None, handoffs=None)
    with pytest.raises(encache.InvalidError, match="dict or None"):
        encache._encache.WorkerStep(None, handoffs=[])


def test_a_worker_dropped_unclosed_frees_its_core_at_once(shm):
    # The WorkerStep calls back into its WorkerCore through a weak proxy:
    # no cycle, so without shutdown() and with the cyclic GC off the core
    # (and its Cache: shm mapping, publisher) goes with its last reference.
    s, w = _pair(shm)
    core = weakref.ref(w.core)
    gc.collect()
    gc.disable()
    try:
        del w
        assert core() is None
    finally:
        gc.enable()
        s.shutdown()


def test_a_plan_whose_items_are_not_a_tuple_takes_pythons_path(shm):
    with _connectors(shm) as (s, w):
        _publish(w, ["A", "B"])
        plan = _meta(s, ["A", "B"]).plan
        object.__setattr__(plan, "items", list(plan.items))
        cache = {}
        assert w.core.state.begin(cache, plan) == 2
        assert set(cache) == {"A", "B"}
        w.core.state.end()


def test_an_abstract_method_left_undefined_still_refuses_the_class():
    # ConnectorHooks takes object's tp_new, so that vLLM's ABC
    # (ECConnectorBase) still refuses a connector missing a method a newer
    # vLLM made abstract.
    class Base(abc.ABC):
        @abc.abstractmethod
        def new_in_vllm(self): ...

    class Connector(encache._encache.ConnectorHooks, Base):
        pass

    with pytest.raises(TypeError, match="abstract"):
        Connector()


def test_inner_connectors_in_a_ring_raise_instead_of_crashing():
    a, b = encache._encache.ConnectorHooks(), encache._encache.ConnectorHooks()
    with pytest.raises(encache.InvalidError, match="its own inner"):
        a._set_hooks(None, a)
    a._set_hooks(None, b)
    b._set_hooks(None, a)
    try:
        with pytest.raises(RecursionError):
            a.no_such_hook
    finally:
        a._set_hooks(None, None)
        b._set_hooks(None, None)


def test_no_reference_is_left_behind_by_a_step(shm):
    with _connectors(shm) as (s, w):
        _publish(w, ["A", "B"])
        meta = _meta(s, ["A", "B"])
        plan, items = meta.plan, meta.plan.items

        def steps(n):
            for _ in range(n):
                cache = {}
                w.bind_connector_metadata(meta)
                w.start_save_caches(encoder_cache=cache)
                w.clear_connector_metadata()
                assert len(cache) == 2

        steps(100)  # warm-up
        gc.collect()
        refs = [sys.getrefcount(o) for o in (meta, plan, items, w)]
        objects = len(gc.get_objects())
        steps(2000)
        gc.collect()
        assert [sys.getrefcount(o) for o in (meta, plan, items, w)] == refs
        assert len(gc.get_objects()) - objects < 50
