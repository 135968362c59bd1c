# SPDX-License-Identifier: Apache-2.0
"""Stand-ins for vLLM's EC connector base types, used only when vLLM cannot
be imported (tests, docs), so that encache.vllm.connector imports
everywhere.  They have the shape of vLLM 0.32.0's
vllm/distributed/ec_transfer/ec_connector/base.py: the role enum, the two
metadata bases, the constructor's producer/consumer flags and the metadata
binding, the five abstract methods and every hook with its default
answer, with vLLM's signatures (tests/vllm_real/test_stand_ins.py compares
them with the installed vLLM's).  None of vLLM's behaviour beyond those
defaults is reproduced.  Inside vLLM the real classes are used and these
are never imported."""

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

    def shutdown(self):
        return None

    # Worker side.

    def bind_connector_metadata(self, connector_metadata):
        self._connector_metadata = connector_metadata

    def clear_connector_metadata(self):
        self._connector_metadata = None

    def _get_connector_metadata(self):
        assert self._connector_metadata is not None
        return self._connector_metadata

    def register_caches(self, ec_caches):
        return

    @abc.abstractmethod
    def start_load_caches(self, encoder_cache, **kwargs):
        ...

    @abc.abstractmethod
    def save_caches(self, encoder_cache, mm_hash, **kwargs):
        ...

    def get_finished(self, finished_req_ids):
        return None, None

    def build_connector_worker_meta(self):
        return None

    def get_ec_connector_stats(self):
        return None

    # Scheduler side.

    @abc.abstractmethod
    def has_cache_item(self, identifier):
        ...

    def ensure_cache_available(self, request, num_computed_tokens):
        return True

    def start_save_caches(self, **kwargs):
        return

    def start_worker_services(self):
        return

    def take_unavailable_requests(self):
        return set()

    def update_state_after_free(self, request, index):
        return

    @abc.abstractmethod
    def update_state_after_alloc(self, request, index):
        ...

    @abc.abstractmethod
    def build_connector_meta(self, scheduler_output):
        ...

    def update_connector_output(self, connector_output):
        return

    def request_finished(self, request):
        return False, None

    def has_pending_push_work(self):
        return False

    @classmethod
    def build_ec_connector_stats(cls, data=None):
        return None

    @classmethod
    def build_prom_metrics(cls, vllm_config, metric_types, labelnames,
                           per_engine_labelvalues):
        return None
