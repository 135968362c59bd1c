# SPDX-License-Identifier: Apache-2.0
"""The connector inside a real vLLM: runs only where `import vllm` works
(it skips on machines without vLLM, saying so).  To run it on your own
machine: build encache, then, with vLLM installed in /usr/bin/python3's
environment (or run tests/vllm/run.sh with that interpreter first on
PATH as /usr/bin/python3 is used),

    bash tests/vllm/run.sh build . -k real_vllm

It checks vLLM's own classes against the lists of test_contract.py (a
method vLLM removed or renamed fails here), that the general plugin
registers the connector with vLLM's factory, and, with
ENCACHE_VLLM_MODEL naming a small multimodal model vLLM can load (random
weights are fine: load_format "dummy"), one encoder with the connector on
an shm Store encoding an image once across two engines."""

import inspect
import os

import pytest

vllm = pytest.importorskip("vllm", reason="vLLM is not installed here "
                           "(`import vllm` fails): the contract suite "
                           "covers the connector without it")

import test_contract  # noqa: E402
from encache.vllm import connector as ecc  # noqa: E402


def test_vllms_base_has_every_method_of_the_lists():
    from vllm.distributed.ec_transfer.ec_connector.base import ECConnectorBase
    assert ecc.HAVE_VLLM and issubclass(ecc.EncacheECConnector,
                                        ECConnectorBase)
    for table in (test_contract.ABSTRACT, test_contract.HOOKS):
        for name in table:
            assert hasattr(ECConnectorBase, name), \
                f"vLLM's ECConnectorBase has no {name} any more"
    abstract = set(ECConnectorBase.__abstractmethods__)
    assert abstract <= set(test_contract.ABSTRACT), \
        f"vLLM declares abstract methods the list lacks: {abstract}"
    for name in test_contract.ABSTRACT:
        params = list(inspect.signature(
            getattr(ECConnectorBase, name)).parameters)[1:]
        assert tuple(p if p != "kwargs" else "**kwargs" for p in params) == \
            test_contract.ABSTRACT[name], f"{name} changed in vLLM"


def test_vllms_bind_and_clear_only_set_the_metadata():
    from vllm.distributed.ec_transfer.ec_connector.base import ECConnectorBase
    test_contract.check_bind_and_clear_only_set_the_metadata(ECConnectorBase)


def test_the_plugin_registers_with_vllms_factory():
    from vllm.distributed.ec_transfer.ec_connector.factory import (
        ECConnectorFactory)
    import encache.vllm
    encache.vllm.register()
    assert "EncacheECConnector" in ECConnectorFactory._registry


@pytest.mark.skipif(not os.environ.get("ENCACHE_VLLM_MODEL"),
                    reason="ENCACHE_VLLM_MODEL names no model")
def test_one_encoder_on_shm(tmp_path):
    import json
    from vllm import LLM
    name = f"ecvllm-{os.getpid()}"
    cfg = {"ec_connector": "EncacheECConnector", "ec_role": "ec_both",
           "ec_connector_extra_config": {
               "cross_encoder_cache": True, "inner_ec_connector": "",
               "store_url": f"shm://{name}?size=256MiB"}}
    llm = LLM(model=os.environ["ENCACHE_VLLM_MODEL"], load_format="dummy",
              ec_transfer_config=json.dumps(cfg), enforce_eager=True,
              max_model_len=2048)
    from PIL import Image
    image = Image.new("RGB", (64, 64), (120, 30, 200))
    prompt = {"prompt": "<image> describe", "multi_modal_data":
              {"image": image}}
    first = llm.generate(prompt)
    second = llm.generate(prompt)
    assert first[0].outputs[0].text == second[0].outputs[0].text
