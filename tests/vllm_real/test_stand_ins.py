# SPDX-License-Identifier: Apache-2.0
"""The stand-ins the fast suite (tests/vllm, Debian's Python, no vLLM)
runs on, checked against the installed vLLM's own classes: every method
or property a stand-in defines exists on the real class with the same
signature (parameter names, kinds and defaults; annotations aside), every
field it carries is one of the real class's, and what the stand-ins
compute (compute_hash(), the abstract methods) is what vLLM computes.  A
stand-in that drifts from the vLLM it stands for fails here."""

import dataclasses
import enum
import inspect

import pytest

import vllm_delivery
import vllm_fakes
from encache.vllm import _shim

from vllm.config import (ECTransferConfig, ModelConfig, MultiModalConfig,
                         VllmConfig)
from vllm.distributed.ec_transfer.ec_connector import base
from vllm.distributed.ec_transfer.ec_connector.mooncake_ec_connector import (
    ECMooncakeConnector)
from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange
from vllm.v1.core.sched.output import NewRequestData, SchedulerOutput
from vllm.v1.request import Request

# stand-in -> the real class it stands for
PAIRS = [
    (_shim.ECConnectorBase, base.ECConnectorBase),
    (_shim.ECConnectorMetadata, base.ECConnectorMetadata),
    (_shim.ECConnectorWorkerMetadata, base.ECConnectorWorkerMetadata),
    (vllm_delivery.RecordingDelivery, ECMooncakeConnector),
    (vllm_fakes.MultiModalConfig, MultiModalConfig),
    (vllm_fakes.ModelConfig, ModelConfig),
    (vllm_fakes.ECTransferConfig, ECTransferConfig),
    (vllm_fakes.VllmConfig, VllmConfig),
    (vllm_fakes.PlaceholderRange, PlaceholderRange),
    (vllm_fakes.MultiModalFeatureSpec, MultiModalFeatureSpec),
    (vllm_fakes.Request, Request),
    (vllm_fakes.NewRequestData, NewRequestData),
    (vllm_fakes.SchedulerOutput, SchedulerOutput),
]
IDS = [f"{fake.__module__}.{fake.__name__}" for fake, _ in PAIRS]


def _shape(f):
    """A callable's signature without annotations."""
    return [(p.name, p.kind.name, p.default)
            for p in inspect.signature(f).parameters.values()]


def _kind(cls, name):
    v = inspect.getattr_static(cls, name)
    return type(v).__name__ if isinstance(
        v, (classmethod, staticmethod, property)) else "method"


@pytest.mark.parametrize("fake, real", PAIRS, ids=IDS)
def test_each_method_has_the_real_signature(fake, real):
    # (a stand-in's private helpers aside: those vLLM has are checked)
    names = [n for n, v in vars(fake).items()
             if not n.startswith("__") and (callable(v) or isinstance(
                 v, (classmethod, staticmethod, property)))
             and (not n.startswith("_") or hasattr(real, n))]
    if dataclasses.is_dataclass(fake):
        names = [n for n in names if n not in
                 {f.name for f in dataclasses.fields(fake)}]
    for name in names:
        assert hasattr(real, name), \
            f"{real.__qualname__} has no {name} (the stand-in has)"
        assert _kind(fake, name) == _kind(real, name), name
        if _kind(fake, name) == "property":
            continue
        assert _shape(getattr(fake, name)) == _shape(getattr(real, name)), \
            f"{fake.__qualname__}.{name}{inspect.signature(getattr(fake, name))}"\
            f" differs from vLLM's {inspect.signature(getattr(real, name))}"


def _real_fields(real):
    if dataclasses.is_dataclass(real):
        return {f.name for f in dataclasses.fields(real)}
    # a plain class: what its constructor takes
    return set(inspect.signature(real.__init__).parameters) - {"self"}


# Instances of the stand-ins that are not dataclasses, for their fields.
INSTANCES = {
    vllm_fakes.MultiModalConfig: lambda: vllm_fakes.MultiModalConfig(),
    vllm_fakes.ModelConfig: lambda: vllm_fakes.ModelConfig(),
    vllm_fakes.ECTransferConfig: lambda: vllm_fakes.ECTransferConfig(
        "EncacheECConnector", "ec_producer", {}),
    vllm_fakes.VllmConfig: lambda: vllm_fakes.VllmConfig(
        vllm_fakes.ECTransferConfig("EncacheECConnector", "ec_producer", {})),
}
# What a stand-in keeps for itself, not a field of vLLM's.
OWN = {vllm_fakes.ModelConfig: {"hidden"}}


@pytest.mark.parametrize("fake, real", [p for p in PAIRS if
                                        dataclasses.is_dataclass(p[0])
                                        or p[0] in INSTANCES],
                         ids=[i for i, p in zip(IDS, PAIRS)
                              if dataclasses.is_dataclass(p[0])
                              or p[0] in INSTANCES])
def test_each_field_is_one_of_the_real_class(fake, real):
    if dataclasses.is_dataclass(fake):
        mine = {f.name for f in dataclasses.fields(fake)}
    else:
        mine = set(vars(INSTANCES[fake]()))
    missing = mine - OWN.get(fake, set()) - _real_fields(real)
    assert not missing, f"vLLM's {real.__qualname__} has no {missing}"


def test_the_roles_are_vllms():
    assert [(m.name, m.value) for m in _shim.ECConnectorRole] == \
        [(m.name, m.value) for m in base.ECConnectorRole]
    assert issubclass(_shim.ECConnectorRole, enum.Enum)


def test_the_stand_in_base_has_every_method_of_vllms():
    def public(cls):
        return {n for k in cls.__mro__ if k not in (object,)
                for n in vars(k) if not n.startswith("_")
                and n not in ("register",)}  # ABC's machinery
    assert public(_shim.ECConnectorBase) == public(base.ECConnectorBase)
    assert _shim.ECConnectorBase.__abstractmethods__ == \
        base.ECConnectorBase.__abstractmethods__
    assert _shim.ECConnectorWorkerMetadata.__abstractmethods__ == \
        base.ECConnectorWorkerMetadata.__abstractmethods__


@pytest.mark.parametrize("settings", [
    {}, {"backend": "TORCH_SDPA"}, {"tp_mode": "data"},
    {"attn_dtype": "fp8"}, {"do_normalize": False},
    {"backend": "FLASH_ATTN", "tp_mode": "data", "attn_dtype": "fp8"}])
def test_the_stand_in_compute_hash_is_vllms(settings):
    names = {"backend": "mm_encoder_attn_backend",
             "tp_mode": "mm_encoder_tp_mode",
             "attn_dtype": "mm_encoder_attn_dtype",
             "do_normalize": "mm_device_do_normalize"}
    real = MultiModalConfig(**{names[k]: v for k, v in settings.items()})
    assert vllm_fakes.MultiModalConfig(**settings).compute_hash() == \
        real.compute_hash()
