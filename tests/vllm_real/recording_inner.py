# SPDX-License-Identifier: Apache-2.0
"""RecordingInner: an inner connector (inner_ec_connector) made from vLLM's
own ECConnectorBase, that overrides every public method of that base, the
abstract ones, the hooks with a default and the class methods, found by
enumerating the installed vLLM's class (base_hooks()), and records each
call that reaches it in CALLS.  A hook a future vLLM adds to its base is
recorded too, so a connector that leaves it to the base's default fails
test_contract.py."""

import abc
import inspect

from vllm.distributed.ec_transfer.ec_connector.base import ECConnectorBase

CALLS = []  # (hook, role name or "class", args, kwargs)

# What the recorder answers, where the wrapper hands the answer on.
ANSWERS = {
    "get_finished": ({"sent"}, None),
    "build_connector_worker_meta": "inner-worker-meta",
    "get_ec_connector_stats": "inner-stats",
    "has_cache_item": False,
    "ensure_cache_available": True,
    "take_unavailable_requests": {"r-unavailable"},
    "build_connector_meta": "inner-meta",
    "request_finished": (False, None),
    "has_pending_push_work": False,
    "build_ec_connector_stats": "inner-built-stats",
    "build_prom_metrics": "inner-prom",
}


def base_hooks() -> dict:
    """name -> "method" or "classmethod": every public method of vLLM's
    ECConnectorBase and its bases (properties and object's aside), in the
    order the class defines them."""
    out = {}
    for klass in reversed(ECConnectorBase.__mro__):
        if klass in (object, abc.ABC):
            continue
        for name, value in vars(klass).items():
            if name.startswith("_"):
                continue
            if isinstance(value, classmethod):
                out[name] = "classmethod"
            elif isinstance(value, staticmethod):
                out[name] = "staticmethod"
            elif inspect.isfunction(value):
                out[name] = "method"
    return out


def _recorder(name, kind):
    if kind == "method":
        def hook(self, *args, **kwargs):
            CALLS.append((name, self.role.name, args, kwargs))
            return ANSWERS.get(name)
        return hook

    def static_hook(*args, **kwargs):
        CALLS.append((name, "class", args, kwargs))
        return ANSWERS.get(name)

    if kind == "staticmethod":
        return staticmethod(static_hook)
    return classmethod(lambda cls, *args, **kwargs: static_hook(*args,
                                                                **kwargs))


def _init(self, vllm_config, role):
    ECConnectorBase.__init__(self, vllm_config, role)
    self.vllm_config = vllm_config
    CALLS.append(("__init__", role.name, (), {}))


def _unknown(self, value):
    CALLS.append(("a_hook_no_vllm_base_has", self.role.name, (value,), {}))
    return "inner's answer"


namespace = {name: _recorder(name, kind)
             for name, kind in base_hooks().items()}
namespace.update(__init__=_init, a_hook_no_vllm_base_has=_unknown,
                 __module__=__name__)
RecordingInner = abc.ABCMeta("RecordingInner", (ECConnectorBase,), namespace)
