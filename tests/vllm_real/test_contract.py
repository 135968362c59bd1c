# SPDX-License-Identifier: Apache-2.0
"""EncacheECConnector against vLLM's own classes (the installed vLLM):
vLLM's factory builds it for both roles from a real VllmConfig, no
abstract method is left, and every hook vLLM's ECConnectorBase defines
(enumerated from the class, so that a hook a newer vLLM adds fails here
until the connector passes it on) is a method of encache's and reaches
the inner connector, with vLLM's arguments; a hook only the inner
connector has is still reached."""

import inspect
import pickle

import pytest

from conftest import real_config, request, reuse_extra

from vllm.distributed.ec_transfer.ec_connector.base import (
    ECConnectorBase, ECConnectorRole)
from vllm.distributed.ec_transfer.ec_connector.factory import (
    ECConnectorFactory)

import encache.vllm
import recording_inner
from encache.vllm import _core
from encache.vllm import connector as ecc

ROLES = (ECConnectorRole.SCHEDULER, ECConnectorRole.WORKER)


@pytest.fixture(autouse=True)
def registered():
    encache.vllm.register()  # what vLLM's plugin loader does (test_plugin)
    recording_inner.CALLS.clear()


def _create(config):
    return [ECConnectorFactory.create_connector(config, role)
            for role in ROLES]


def test_the_factory_builds_it_for_both_roles_with_vllms_inner(
        model_dir, store, tmp_path):
    # The inner connector made by vLLM's factory from the same
    # configuration: vLLM's ECExampleConnector (ECMooncakeConnector, the
    # default, needs the mooncake package, which needs CUDA).
    config = real_config(model_dir, extra=reuse_extra(
        store(), inner="ECExampleConnector",
        shared_storage_path=str(tmp_path)))
    made = _create(config)
    try:
        for connector, role in zip(made, ROLES):
            assert type(connector) is ecc.EncacheECConnector
            assert isinstance(connector, ECConnectorBase)
            assert connector.role == role and connector.is_producer
            inner = connector._inner
            assert type(inner).__name__ == "ECExampleConnector"
            ec = inner._vllm_config.ec_transfer_config
            assert ec.ec_connector == "ECExampleConnector"
            assert ec.ec_connector_extra_config["cross_encoder_cache"] is False
            assert "store_url" not in ec.ec_connector_extra_config
        assert made[1].namespace.startswith("embedding@model:")
    finally:
        for c in made:
            c.shutdown()


def test_no_abstract_method_is_left(model_dir, store):
    assert not inspect.isabstract(ecc.EncacheECConnector)
    assert not ecc.EncacheECConnector.__abstractmethods__
    assert set(ECConnectorBase.__abstractmethods__) == {
        "start_load_caches", "save_caches", "has_cache_item",
        "update_state_after_alloc", "build_connector_meta"}, \
        "vLLM's abstract methods changed: read its base.py again"
    for c in _create(real_config(model_dir, extra=reuse_extra(store()))):
        c.shutdown()


def _sample(name, config, connector):
    """An argument vLLM would pass for a parameter of this name."""
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.outputs import ECConnectorOutput
    return {
        "encoder_cache": {},
        "mm_hash": "mm-1",
        "identifier": "mm-1",
        "request": request("r1", ["mm-1"]),
        "index": 0,
        "num_computed_tokens": 0,
        "scheduler_output": SchedulerOutput.make_empty(),
        "connector_metadata": ecc.EncacheECConnectorMetadata(
            _core.StepPlan(), "inner-meta"),
        "finished_req_ids": {"r-done"},
        "connector_output": ECConnectorOutput(),
        "ec_caches": {},
        "data": {"sent": 1},
        "vllm_config": config,
        "metric_types": {},
        "labelnames": ["model_name"],
        "per_engine_labelvalues": {0: ["m"]},
    }.get(name, ("an argument of a hook this test does not know", name))


def _call(target, name, config, connector):
    """Calls hook `name` of target as vLLM's call sites do: its parameters
    by position, start_save_caches' keywords by name (encoder_cache=)."""
    sig = inspect.signature(getattr(ECConnectorBase, name))
    args, kwargs = [], {}
    for p in sig.parameters.values():
        if p.name in ("self", "cls"):
            continue
        if p.kind is p.VAR_KEYWORD:
            if name == "start_save_caches":
                kwargs["encoder_cache"] = {}
        elif p.kind is not p.VAR_POSITIONAL:
            args.append(_sample(p.name, config, connector))
    return getattr(target, name)(*args, **kwargs), args, kwargs


def test_every_hook_of_vllms_base_reaches_the_inner_connector(model_dir,
                                                              store):
    hooks = recording_inner.base_hooks()
    # The hooks the issue found vLLM's base defining are among them.
    assert {"start_save_caches", "start_worker_services",
            "take_unavailable_requests", "update_state_after_free",
            "get_ec_connector_stats", "build_ec_connector_stats",
            "build_prom_metrics"} <= set(hooks)
    # Each is encache's own (its class or its C base), never the base's
    # default nor the inner connector's through attribute lookup.
    mine = set(vars(ecc.EncacheECConnector)) | set(
        vars(encache._encache.ConnectorHooks))
    assert set(hooks) - mine == set(), \
        f"hooks of vLLM's base that encache does not define: " \
        f"{sorted(set(hooks) - mine)}"
    config = real_config(model_dir, extra=reuse_extra(store(),
                                                      inner="RecordingInner"))
    made = _create(config)
    calls = recording_inner.CALLS
    order = [n for n in hooks if n != "shutdown"] + ["shutdown"]
    for connector in made:
        role = connector.role.name
        for name in order:
            if hooks[name] != "method":
                continue
            del calls[:]
            answer, args, kwargs = _call(connector, name, config, connector)
            got = [c for c in calls if c[0] == name]
            assert len(got) == 1 and got[0][1] == role, \
                f"{role} {name}: the inner connector got {calls}"
            _, _, inner_args, inner_kwargs = got[0]
            if name == "bind_connector_metadata":
                assert inner_args == ("inner-meta",)  # its own part
            elif name == "start_save_caches":
                assert inner_kwargs == {"encoder_cache": {}}
            else:
                assert (inner_args, inner_kwargs) == (tuple(args), kwargs), \
                    f"{name}: vLLM's arguments were not passed on"
            want = recording_inner.ANSWERS.get(name)
            if name == "build_connector_meta":
                assert answer.inner == want
                assert pickle.loads(pickle.dumps(answer)).inner == want
            elif name in ("has_cache_item", "ensure_cache_available",
                          "has_pending_push_work"):
                assert answer == want
            elif want is not None:
                assert answer == want, f"{name}: the inner's answer is lost"
    for name, kind in hooks.items():
        if kind == "method":
            continue
        del calls[:]
        answer, args, _ = _call(ecc.EncacheECConnector, name, config, None)
        got = [c for c in calls if c[0] == name]
        assert len(got) == 1, f"class method {name}: {calls}"
        assert answer == recording_inner.ANSWERS[name]
        if name == "build_prom_metrics":
            # given the inner connector's own configuration
            inner_config = got[0][2][0]
            assert inner_config.ec_transfer_config.ec_connector == \
                "RecordingInner"
            assert got[0][2][1:] == tuple(args[1:])
        else:
            assert got[0][2] == tuple(args)


def test_a_hook_only_the_inner_connector_has_is_still_reached(model_dir,
                                                              store):
    assert not hasattr(ECConnectorBase, "a_hook_no_vllm_base_has")
    made = _create(real_config(model_dir, extra=reuse_extra(
        store(), inner="RecordingInner")))
    try:
        for c in made:
            assert c.a_hook_no_vllm_base_has(7) == "inner's answer"
            assert recording_inner.CALLS[-1] == (
                "a_hook_no_vllm_base_has", c.role.name, (7,), {})
    finally:
        for c in made:
            c.shutdown()


def test_base_bind_and_clear_only_set_the_metadata():
    # encache's C hooks set _connector_metadata themselves (vllm_hooks.c):
    # right while vLLM's two methods do nothing else.
    import types
    obj, m = types.SimpleNamespace(_connector_metadata=None), object()
    ECConnectorBase.bind_connector_metadata(obj, m)
    assert vars(obj) == {"_connector_metadata": m}
    ECConnectorBase.clear_connector_metadata(obj)
    assert vars(obj) == {"_connector_metadata": None}


def test_worker_hooks_accept_vllms_parameter_names():
    # Every hook of encache's takes the base's parameters, by position
    # and by name (vLLM's call sites use both: save_caches(encoder_cache=,
    # mm_hash=)).
    for name, kind in recording_inner.base_hooks().items():
        base = inspect.signature(getattr(ECConnectorBase, name))
        ours = inspect.signature(getattr(ecc.EncacheECConnector, name))
        params = [p for p in base.parameters.values()
                  if p.name not in ("self", "cls")
                  and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        head = () if kind == "classmethod" else (None,)
        try:
            ours.bind(*head, *[object() for _ in params])
            ours.bind(*head, **{p.name: object() for p in params})
        except TypeError as e:
            pytest.fail(f"{name}{ours} refuses vLLM's {base}: {e}")
