# SPDX-License-Identifier: Apache-2.0
"""Registration: the vllm.general_plugins entry point installed with the
package (vLLM loads every plugin of that group in each process it starts,
vllm/plugins/__init__.py, load_general_plugins, vLLM 0.32.0:
entry_points(group=...), filtered by name with VLLM_PLUGINS, each loaded
and called), and ECConnectorFactory.register_connector(name, module_path,
class_name) as in vllm/distributed/ec_transfer/ec_connector/factory.py
(0.32.0; the same in 0.34.0), re-created below with the same registry and
loader.  tests/vllm_real/test_plugin.py runs vLLM's own."""

import importlib
import importlib.metadata

import pytest

import encache.vllm
from encache.vllm import connector as ecc


class Factory:
    """ECConnectorFactory's registry, as factory.py (0.32.0) has it."""
    _registry = {}

    @classmethod
    def register_connector(cls, name, module_path, class_name):
        if name in cls._registry:
            raise ValueError(f"Connector '{name}' is already registered.")

        def loader():
            return getattr(importlib.import_module(module_path), class_name)

        cls._registry[name] = loader


def _entry_points():
    eps = importlib.metadata.entry_points()
    if hasattr(eps, "select"):
        return list(eps.select(group="vllm.general_plugins"))
    return list(eps.get("vllm.general_plugins", ()))


def test_the_entry_point_is_installed_with_the_package():
    ours = [ep for ep in _entry_points() if ep.name == "encache"]
    assert len(ours) == 1, _entry_points()
    assert ours[0].value == "encache.vllm:register"
    assert ours[0].load() is encache.vllm.register
    assert importlib.metadata.version("encache") == encache.__version__


def test_register_registers_once_and_loads_the_class():
    Factory._registry.clear()
    assert encache.vllm.register(Factory) is True
    assert encache.vllm.register(Factory) is False  # each process calls it
    assert Factory._registry["EncacheECConnector"]() is ecc.EncacheECConnector


def test_the_module_path_form_names_the_class():
    # ec_connector_module_path: the factory imports the module and takes
    # the attribute named by ec_connector.
    module = importlib.import_module(encache.vllm.CONNECTOR_MODULE)
    assert getattr(module, encache.vllm.CONNECTOR_NAME) is \
        ecc.EncacheECConnector


def test_without_vllm_the_plugin_registers_nothing():
    if ecc.HAVE_VLLM:
        pytest.skip("vLLM is importable")
    assert encache.vllm.register() is False
