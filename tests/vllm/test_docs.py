# SPDX-License-Identifier: Apache-2.0
"""docs/vllm.md's configurations: each JSON block is valid, the first is
the reference's, every other one is the same configuration with only
"ec_connector" changed and the connector's own options added, and the
connector accepts it."""

import json
import os
import re

from encache.vllm import _core

PAGE = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "vllm.md")


def blocks():
    text = open(PAGE, encoding="utf-8").read()
    return [json.loads(b) for b in re.findall(r"```json\n(.*?)```", text,
                                              re.S)]


def test_each_store_is_one_change_from_the_reference():
    reference, *ours = blocks()
    assert reference["ec_connector"] == "ECMooncakeConnector"
    assert len(ours) == 5  # shm, Redis, Redis Cluster, two tiers, Mooncake
    ref_extra = reference["ec_connector_extra_config"]
    own = set(_core.OWN_OPTIONS) | {"single_flight", "single_flight_wait_ms"}
    for cfg in ours:
        assert cfg["ec_connector"] == "EncacheECConnector"
        assert cfg["ec_role"] == reference["ec_role"]
        extra = cfg["ec_connector_extra_config"]
        for k, v in extra.items():
            assert k in own or ref_extra.get(k) == v, (k, v)
        c = _core.ConnectorConfig.from_ec_transfer_config(cfg)
        assert c.enabled and c.store_url and c.inner == "ECMooncakeConnector"
        assert "store_url" not in c.library_config["ec_connector_extra_config"]
