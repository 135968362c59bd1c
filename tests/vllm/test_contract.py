# SPDX-License-Identifier: Apache-2.0
"""The connector class against vLLM's interface: the abstract methods and
the hooks of ECConnectorBase, with their parameters, as they are in
vllm-project/vllm, vllm/distributed/ec_transfer/ec_connector/base.py at
commit 035e2dd3a4b5edaa4c3f3ab98795f6e34eebf2c6 (written here from that
file), and the producer hooks of ECMooncakeConnector
(vllm/distributed/ec_transfer/ec_connector/mooncake_ec_connector.py,
0b319fdcfe2ab13f1358b9de85bd0459fd93451d).  A method of these lists that
the connector lacks, or whose parameters it would not accept, fails here;
where vLLM is importable (test_real_vllm.py), the same lists are checked
against vLLM's own class, so that a method vLLM removes or renames fails
too."""

import inspect

import pytest

from encache.vllm import connector as ecc

# name -> the parameters vLLM passes (after self), from base.py 035e2dd3.
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
}
# ECMooncakeConnector 0b319fdc: the producer's lookup point and the extra
# argument of its ensure_cache_available.
PRODUCER = {
    "start_save_caches": ("encoder_cache", "**kwargs"),
    "ensure_cache_available": ("request", "num_computed_tokens",
                               "local_cache_hashes"),
}


def _call_args(params):
    """Positional and keyword arguments as vLLM's call sites pass them."""
    args = [object() for p in params if not p.startswith("**")]
    kwargs = {"marker": 1} if any(p.startswith("**") for p in params) else {}
    return args, kwargs


@pytest.mark.parametrize("table", [ABSTRACT, HOOKS, PRODUCER],
                         ids=["abstract", "hooks", "producer"])
def test_every_method_vllm_calls_is_there_and_takes_its_arguments(table):
    for name, params in table.items():
        method = getattr(ecc.EncacheECConnector, name, None)
        assert callable(method), f"EncacheECConnector lacks {name}"
        sig = inspect.signature(method)
        args, kwargs = _call_args(params)
        try:
            sig.bind(None, *args, **kwargs)
        except TypeError as e:
            pytest.fail(f"{name}{sig} refuses vLLM's call {params}: {e}")
        # Called by keyword too, as the model runner calls save_caches
        # (encoder_cache=..., mm_hash=...) and start_save_caches.
        named = {p: object() for p in params if not p.startswith("**")}
        sig.bind(None, **named)


def test_no_abstract_method_is_left():
    assert not getattr(ecc.EncacheECConnector, "__abstractmethods__", set())


def test_the_stand_in_base_has_vllms_abstract_methods():
    # Without vLLM the class binds to encache.vllm._shim; its abstract set
    # must not hide one of vLLM's (it declares none: the connector's own
    # definitions are what the lists above check).
    if ecc.HAVE_VLLM:
        pytest.skip("vLLM is importable: test_real_vllm.py checks its class")
    from encache.vllm import _shim
    assert set(_shim.ECConnectorBase.__abstractmethods__) <= set(ABSTRACT)


def check_bind_and_clear_only_set_the_metadata(base):
    """The connector sets _connector_metadata itself in its bind and clear
    hooks, without super(): right only while the base class's two methods
    do nothing but that assignment (vllm/distributed/ec_transfer/
    ec_connector/base.py at 035e2dd3a4b5edaa4c3f3ab98795f6e34eebf2c6)."""
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
    listed = set(ABSTRACT) | set(HOOKS) | set(PRODUCER)
    assert calls - listed == set(), sorted(calls - listed)
    # And the engine exercises every abstract method but a consumer's two
    # (start_load_caches, and update_state_after_alloc for an external
    # load) and the producer's lookup point.
    assert set(ABSTRACT) - {"start_load_caches",
                            "update_state_after_alloc"} <= calls
    assert "start_save_caches" in calls
