# SPDX-License-Identifier: Apache-2.0
"""The contract against the real vLLM (scripts/vllm-real.sh runs it in the
virtual environment of scripts/vllm-venv.sh: vLLM from the Python package
index, encache installed with pip from the checkout).  Fixtures: a fresh
shm Store per test, destroyed after it with the installed `encache` tool
(or the real Mooncake Store: ENCACHE_VLLM_REAL_STORE=mooncake);
the tiny model configuration (tiny_vlm.py); real VllmConfig objects."""

import itertools
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "vllm"))  # the stand-ins

# No model, tokenizer or processor is ever fetched.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import vllm  # noqa: E402  (a vLLM that does not import fails the run)

import tiny_vlm  # noqa: E402

# The encache tool of the environment the tests run in (pip put it beside
# its python).
ENCACHE = os.path.join(os.path.dirname(sys.executable), "encache")
_names = itertools.count()


def encache_tool(*args, check=True):
    p = subprocess.run([ENCACHE, *args], capture_output=True, timeout=60)
    if check and p.returncode != 0:
        raise AssertionError(f"encache {' '.join(args)} exited "
                             f"{p.returncode}: {p.stderr.decode()}")
    return p


# The Store the suite runs on: "shm" (default: a fresh shm Store per
# call, destroyed after the test) or "mooncake" (the real Mooncake Store
# that tests/mooncake_real.sh starts, empty at its start, and names with
# MOONCAKE_CONFIG_PATH; its objects stay until that script stops it: the
# tests that publish do it under namespaces no other test uses).
STORE = os.environ.get("ENCACHE_VLLM_REAL_STORE", "shm")
if STORE not in ("shm", "mooncake"):
    raise RuntimeError(f"ENCACHE_VLLM_REAL_STORE={STORE!r}: not shm or "
                       "mooncake")


@pytest.fixture
def store():
    """store(): the URL of a Store for one connector: a fresh shm Store
    (16 MiB, destroyed after the test), or the real Mooncake Store
    (ENCACHE_VLLM_REAL_STORE=mooncake)."""
    made = []

    def make():
        if STORE == "mooncake":
            assert os.environ.get("MOONCAKE_CONFIG_PATH"), \
                "ENCACHE_VLLM_REAL_STORE=mooncake needs MOONCAKE_CONFIG_PATH"
            return "mooncake:"
        name = f"ecreal-{os.getpid()}-{next(_names)}"
        made.append(name)
        return f"shm://{name}?size=16MiB"

    yield make
    for name in made:
        encache_tool("shm", "destroy", name, check=False)


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    """The tiny Qwen3-VL-like configuration with DeepStack (tiny_vlm.py)."""
    tiny_vlm.register()
    return tiny_vlm.write(str(tmp_path_factory.mktemp("tiny-deepstack")))


@pytest.fixture(scope="session")
def plain_model_dir(tmp_path_factory):
    """A Qwen2-VL configuration, without DeepStack: another model."""
    tiny_vlm.register()
    return tiny_vlm.write_plain(str(tmp_path_factory.mktemp("tiny-plain")))


def real_config(model, role="ec_producer", extra=None, connector=
                "EncacheECConnector", module_path=None, **model_kwargs):
    """A real VllmConfig: vLLM's ModelConfig of the model directory (no
    tokenizer, no weights), with model_kwargs (dtype, revision, the
    multimodal options), and vLLM's ECTransferConfig."""
    from vllm.config import ECTransferConfig, ModelConfig, VllmConfig
    model_kwargs.setdefault("dtype", "float32")
    mc = ModelConfig(model=model, skip_tokenizer_init=True, **model_kwargs)
    ec = ECTransferConfig(ec_connector=connector, ec_role=role,
                          ec_connector_module_path=module_path,
                          ec_connector_extra_config=dict(extra or {}))
    return VllmConfig(model_config=mc, ec_transfer_config=ec)


def reuse_extra(store_url, inner="", **more):
    """ec_connector_extra_config of an encoder with encache's reuse on
    store_url; inner: the inner connector ("" none, "RecordingInner" the
    recorder of recording_inner.py, or a connector vLLM's factory knows)."""
    extra = {"cross_encoder_cache": True, "store_url": store_url,
             "inner_ec_connector": inner, "stats_segment": "off"}
    if inner == "RecordingInner":
        extra["inner_ec_connector_module_path"] = "recording_inner"
    extra.update(more)
    return extra


def request(req_id, identifiers, rows=4, modality="image"):
    """vLLM's Request with one MultiModalFeatureSpec per identifier."""
    from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange
    from vllm.sampling_params import SamplingParams
    from vllm.v1.request import Request
    features = [MultiModalFeatureSpec(None, modality, ident,
                                      PlaceholderRange(i * rows, rows))
                for i, ident in enumerate(identifiers)]
    return Request(req_id, list(range(rows * len(identifiers))),
                   SamplingParams(), None, mm_features=features)
