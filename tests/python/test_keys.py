# SPDX-License-Identifier: Apache-2.0
"""encache.vllm_encoder_hash() against the vectors written from vLLM's
compute_hash() for each factor list (tests/vllm_vectors.json), the same
the C library and the tool are checked against (issue 27)."""
import json
import pathlib

import pytest

import encache

VECTORS = json.loads((pathlib.Path(__file__).parent.parent /
                      "vllm_vectors.json").read_text())


@pytest.mark.parametrize("c", VECTORS["encoder_hash_factors"],
                         ids=lambda c: c["text"])
def test_vectors(c):
    got = encache.vllm_encoder_hash(
        tp_mode=c.get("tp_mode") or "weights",
        attn_backend=c.get("attn_backend"), attn_dtype=c.get("attn_dtype"),
        fp8_scale_path=c.get("fp8_scale_path"), factors=c["factors"])
    assert got == c["hash"]


def test_default_is_the_newest_list():
    # MD5 of str([None, 'weights', None, None]).
    assert encache.vllm_encoder_hash() == "dd7a6ff1cee4ccb4a87001c107039398"
    assert encache.vllm_encoder_hash(factors=2) == \
        "37a439e484856856b929daf9ace244bc"


def test_lower_case_backend_is_upper_cased():
    assert encache.vllm_encoder_hash(attn_backend="flash_attn") == \
        encache.vllm_encoder_hash(attn_backend="FLASH_ATTN")


@pytest.mark.parametrize("kw", [{"factors": 3}, {"factors": True},
                                {"tp_mode": "tensor"}])
def test_refusals(kw):
    with pytest.raises(ValueError):
        encache.vllm_encoder_hash(**kw)


def test_namespace_with_it(tmp_path):
    h = encache.vllm_encoder_hash()
    with encache.Cache(ec_transfer_config={"ec_connector_extra_config": {
            "cross_encoder_cache": True}}, model="org/vlm", encoder_hash=h,
            dtype="bfloat16", store=f"shm://pk{tmp_path.name[-8:]}?size=4MiB&create=yes") as c:
        assert f"@encoder:{h}@" in c.namespace


def test_import_from_the_source_tree_names_the_cause(tmp_path):
    """From inside python/ the source package has no extension: the error
    says so (it was "partially initialized module ... circular import")."""
    import os
    import subprocess
    src = pathlib.Path(__file__).parent.parent.parent / "python"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run(["/usr/bin/python3", "-c", "import encache"],
                       cwd=src, env=env, capture_output=True, text=True)
    assert r.returncode != 0
    assert "there is no compiled extension encache._encache in" in r.stderr
    assert "repository's python/ source directory" in r.stderr
    assert "circular import" not in r.stderr
