# SPDX-License-Identifier: Apache-2.0
"""Stand-ins for vLLM's EC connector base types, used only when vLLM cannot
be imported (tests, docs), so that encache.vllm.connector imports
everywhere.  They have the shape of vllm-project/vllm's
vllm/distributed/ec_transfer/ec_connector/base.py at commit
035e2dd3a4b5edaa4c3f3ab98795f6e34eebf2c6 (the role enum, the two metadata
bases, the constructor's producer/consumer flags and the metadata binding);
none of vLLM's behaviour is reproduced.  Inside vLLM the real classes are
used and these are never imported."""

from __future__ import annotations

import abc
import enum


class ECConnectorRole(enum.Enum):
    SCHEDULER = 0
    WORKER = 1


class ECConnectorMetadata(abc.ABC):  # noqa: B024 (as vLLM's)
    pass


class ECConnectorWorkerMetadata(abc.ABC):
    @abc.abstractmethod
    def aggregate(self, other):
        ...


class ECConnectorBase(abc.ABC):
    def __init__(self, vllm_config, role):
        self._connector_metadata = None
        self._vllm_config = vllm_config
        self._role = role
        ec = vllm_config.ec_transfer_config
        if ec is None:
            raise ValueError("ec_transfer_config must be set for ECConnectorBase")
        self._is_producer = ec.is_ec_producer
        self._is_consumer = ec.is_ec_consumer

    @property
    def role(self):
        return self._role

    @property
    def is_producer(self):
        return self._is_producer

    @property
    def is_consumer(self):
        return self._is_consumer

    def bind_connector_metadata(self, connector_metadata):
        self._connector_metadata = connector_metadata

    def clear_connector_metadata(self):
        self._connector_metadata = None

    def _get_connector_metadata(self):
        assert self._connector_metadata is not None
        return self._connector_metadata
