# SPDX-License-Identifier: Apache-2.0
"""The connector class against vLLM's interface: the abstract methods and
the hooks of ECConnectorBase, with their parameters, as they are in vLLM
0.32.0's vllm/distributed/ec_transfer/ec_connector/base.py (written here
from that file).  A method of these lists that the connector lacks, or
whose parameters it would not accept, fails here; tests/vllm_real
(scripts/vllm-real.sh) checks the connector against the installed vLLM's
own classes, enumerating their methods, so that a hook vLLM adds, removes
or renames fails there."""

import inspect

import pytest

from encache.vllm import connector as ecc

# name -> the parameters vLLM passes (after self), from base.py, 0.32.0.
ABSTRACT = {
    "start_load_caches": ("encoder_cache", "**kwargs"),
    "save_caches": ("encoder_cache", "mm_hash", "**kwargs"),
    "has_cache_item": ("identifier",),
    "update_state_after_alloc": ("request", "index"),
    "build_connector_meta": ("scheduler_output",),
}
HOOKS = {
    "shutdown": (),
    "bind_connector_metadata": ("connector_metadata",),
    "clear_connector_metadata": (),
    "register_caches": ("ec_caches",),
    "get_finished": ("finished_req_ids",),
    "build_connector_worker_meta": (),
    "ensure_cache_available": ("request", "num_computed_tokens"),
    "update_connector_output": ("connector_output",),
    "request_finished": ("request",),
    "has_pending_push_work": (),
    "start_worker_services": (),
    "take_unavailable_requests": (),
    "update_state_after_free": ("request", "index"),
    "get_ec_connector_stats": (),
}
# The producer's lookup point, called by keyword (encoder_cache=...); and
# an argument an older ECMooncakeConnector's ensure_cache_available took
# (local_cache_hashes), passed on if a vLLM passes it.
PRODUCER = {
    "start_save_caches": ("encoder_cache", "**kwargs"),
    "ensure_cache_available": ("request", "num_computed_tokens",
                               "local_cache_hashes"),
}
# The class methods vLLM calls on the connector's class (metrics.py).
CLASS_HOOKS = {
    "build_ec_connector_stats": ("data",),
    "build_prom_metrics": ("vllm_config", "metric_types", "labelnames",
                           "per_engine_labelvalues"),
}


def _call_args(params):
    """Positional and keyword arguments as vLLM's call sites pass them."""
    args = [object() for p in params if not p.startswith("**")]
    kwargs = {"marker": 1} if any(p.startswith("**") for p in params) else {}
    return args, kwargs


@pytest.mark.parametrize("table", [ABSTRACT, HOOKS, PRODUCER, CLASS_HOOKS],
                         ids=["abstract", "hooks", "producer", "class"])
def test_every_method_vllm_calls_is_there_and_takes_its_arguments(table):
    for name, params in table.items():
        method = getattr(ecc.EncacheECConnector, name, None)
        assert callable(method), f"EncacheECConnector lacks {name}"
        # Its own, not the base class's default: a default would never
        # reach the inner connector.
        assert name in vars(ecc.EncacheECConnector) or name in vars(
            ecc.encache._encache.ConnectorHooks), name
        sig = inspect.signature(method)
        head = () if table is CLASS_HOOKS else (None,)
        args, kwargs = _call_args(params)
        try:
            sig.bind(*head, *args, **kwargs)
        except TypeError as e:
            pytest.fail(f"{name}{sig} refuses vLLM's call {params}: {e}")
        # Called by keyword too, as the model runner calls save_caches
        # (encoder_cache=..., mm_hash=...) and start_save_caches.
        named = {p: object() for p in params if not p.startswith("**")}
        sig.bind(*head, **named)


def test_no_abstract_method_is_left():
    assert not getattr(ecc.EncacheECConnector, "__abstractmethods__", set())


def test_the_stand_in_base_has_vllms_abstract_methods():
    # Without vLLM the class binds to encache.vllm._shim; its abstract set
    # must not hide one of vLLM's (it declares none: the connector's own
    # definitions are what the lists above check).
    if ecc.HAVE_VLLM:
        pytest.skip("vLLM is importable: tests/vllm_real checks its class")
    from encache.vllm import _shim
    assert set(_shim.ECConnectorBase.__abstractmethods__) <= set(ABSTRACT)


def check_bind_and_clear_only_set_the_metadata(base):
    """The connector sets _connector_metadata itself in its bind and clear
    hooks, without super(): right only while the base class's two methods
    do nothing but that assignment (vllm/distributed/ec_transfer/
    ec_connector/base.py, vLLM 0.32.0; tests/vllm_real checks the real
    one)."""
    import types
    obj, m = types.SimpleNamespace(_connector_metadata=None), object()
    base.bind_connector_metadata(obj, m)
    assert vars(obj) == {"_connector_metadata": m}, \
        "ECConnectorBase.bind_connector_metadata does more than set it"
    base.clear_connector_metadata(obj)
    assert vars(obj) == {"_connector_metadata": None}, \
        "ECConnectorBase.clear_connector_metadata does more than clear it"


def test_bind_and_clear_set_the_metadata_as_the_base_class_does(shm):
    import vllm_fakes as vf
    from encache.vllm import _core
    check_bind_and_clear_only_set_the_metadata(ecc.ECConnectorBase)
    w = ecc.EncacheECConnector(vf.vllm_config(shm()),
                               ecc.ECConnectorRole.WORKER)
    try:
        m = ecc.EncacheECConnectorMetadata(_core.StepPlan())
        w.bind_connector_metadata(m)
        assert w._get_connector_metadata() is m
        w.clear_connector_metadata()
        assert w._connector_metadata is None
    finally:
        w.shutdown()


def test_metadata_is_vllms_kind_and_pickles():
    import pickle
    from encache.vllm import _core
    m = ecc.EncacheECConnectorMetadata(
        _core.StepPlan((_core.Candidate("h", 4, 8, "torch.float32"),)),
        {"inner": 1})
    assert isinstance(m, ecc.ECConnectorMetadata)
    assert pickle.loads(pickle.dumps(m)) == m


def test_the_package_imports_no_vllm():
    import subprocess
    import sys
    code = ("import sys, encache.vllm, encache.vllm.connector;"
            "print(any(m == 'vllm' or m.startswith('vllm.') "
            "for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True,
                         text=True, check=True).stdout.strip()
    assert out == ("True" if ecc.HAVE_VLLM else "False")


class _Recorder:
    """Forwards to a connector and records the methods called on it."""

    def __init__(self, target, calls):
        object.__setattr__(self, "_target", target)
        object.__setattr__(self, "_calls", calls)

    def __getattr__(self, name):
        value = getattr(self._target, name)
        if callable(value):
            self._calls.add(name)
        return value


def test_every_call_the_engine_makes_is_in_the_lists(shm):
    # The suite's engine (vllm_fakes.Engine, vLLM's call order) calls
    # only methods of the lists above: a call vLLM makes that the lists
    # lack, or one removed from them, fails here or above.
    import vllm_fakes as vf
    calls = set()
    e = vf.Engine(vf.vllm_config(shm()))
    try:
        e.scheduler = _Recorder(e.scheduler, calls)
        e.worker = _Recorder(e.worker, calls)
        reqs = [vf.request("r1", ["A", "B"])]
        e.step(reqs)
        e.step(reqs)
        e.finish(reqs)
    finally:
        e.shutdown()
    listed = set(ABSTRACT) | set(HOOKS) | set(PRODUCER) | set(CLASS_HOOKS)
    assert calls - listed == set(), sorted(calls - listed)
    # And the engine exercises every abstract method but a consumer's two
    # (start_load_caches, and update_state_after_alloc for an external
    # load) and the producer's lookup point.
    assert set(ABSTRACT) - {"start_load_caches",
                            "update_state_after_alloc"} <= calls
    assert "start_save_caches" in calls
