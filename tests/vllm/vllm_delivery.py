# SPDX-License-Identifier: Apache-2.0
"""RecordingDelivery: the inner connector of the tests, in place of vLLM's
ECMooncakeConnector (whose P2P transfer needs Mooncake's TransferEngine),
its methods with that class's signatures (vLLM 0.32.0,
vllm/distributed/ec_transfer/ec_connector/mooncake_ec_connector.py;
tests/vllm_real/test_stand_ins.py compares them).
It records each call of vLLM's interface that reaches it, with what the
encoder cache held at that moment, so that a test sees that delivery
stays the inner connector's: every output, hit or encoded, reaches it."""

from encache.vllm._shim import ECConnectorBase

CALLS = []


class RecordingDelivery(ECConnectorBase):
    def __init__(self, vllm_config, role):
        super().__init__(vllm_config, role)
        self.extra = dict(vllm_config.ec_transfer_config
                          .ec_connector_extra_config)
        self.name = vllm_config.ec_transfer_config.ec_connector
        self.calls = []
        CALLS.append(self)

    def _note(self, *what):
        self.calls.append(what)

    def bind_connector_metadata(self, connector_metadata):
        super().bind_connector_metadata(connector_metadata)
        self._note("bind", connector_metadata)

    def start_save_caches(self, **kwargs):
        self._note("start_save_caches",
                   set(kwargs.get("encoder_cache") or ()))

    def start_load_caches(self, encoder_cache, **kwargs):
        self._note("start_load_caches", set(encoder_cache))

    def save_caches(self, encoder_cache, mm_hash, **kwargs):
        self._note("save_caches", mm_hash)

    def has_cache_item(self, identifier):
        self._note("has_cache_item", identifier)
        return False

    def update_state_after_alloc(self, request, index):
        self._note("update_state_after_alloc", request.request_id, index)

    def build_connector_meta(self, scheduler_output):
        self._note("build_connector_meta")
        return {"inner": "meta"}

    def get_finished(self, finished_req_ids):
        self._note("get_finished")
        return {"sent"}, None

    def build_connector_worker_meta(self):
        return "worker-meta"

    def take_unavailable_requests(self):
        return {"r-unavailable"}

    def shutdown(self):
        self._note("shutdown")
