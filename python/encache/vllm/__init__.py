# SPDX-License-Identifier: Apache-2.0
"""encache inside vLLM: the EC connector "EncacheECConnector" (docs/vllm.md).

A vLLM encoder switches from vLLM's own cross-encoder reuse to encache's by
one change of its --ec-transfer-config: "ec_connector":
"EncacheECConnector" (the Store and encache's options go in
ec_connector_extra_config beside vLLM's).  vLLM finds the connector through
the general plugin that this package installs (entry point
vllm.general_plugins: encache = encache.vllm:register), or through
"ec_connector_module_path": "encache.vllm.connector" where vLLM's factory
loads module paths.

Importing this package imports no vLLM: the connector's logic is in
encache.vllm._core; encache.vllm.connector binds it to vLLM's base class.
"""

from ._core import (CONNECTOR_MODULE, CONNECTOR_NAME, Candidate,
                    ConnectorConfig, SchedulerCore, StepPlan, WorkerCore)


def register(factory=None) -> bool:
    """vLLM's general plugin: registers EncacheECConnector with vLLM's
    ECConnectorFactory (lazily: the connector's module is imported only
    when an engine asks for it).  vLLM calls it in every process it
    starts; a second call, or a name vLLM already knows, is a no-op.
    Returns whether it registered.  factory: for tests; None is vLLM's
    (without vLLM, nothing is registered)."""
    if factory is None:
        try:
            from vllm.distributed.ec_transfer.ec_connector.factory import (
                ECConnectorFactory as factory)
        except ImportError:
            return False
    registry = getattr(factory, "_registry", {})
    if CONNECTOR_NAME in registry:
        return False
    try:
        factory.register_connector(CONNECTOR_NAME, CONNECTOR_MODULE,
                                   CONNECTOR_NAME)
    except ValueError:  # "already registered", by a factory without
        return False    # a _registry to look at first
    return True


__all__ = ["CONNECTOR_NAME", "CONNECTOR_MODULE", "Candidate",
           "ConnectorConfig", "SchedulerCore", "StepPlan", "WorkerCore",
           "register"]
