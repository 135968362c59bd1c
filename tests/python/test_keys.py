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


def test_namespace_with_it(shm):
    h = encache.vllm_encoder_hash()
    with encache.Cache(ec_transfer_config={"ec_connector_extra_config": {
            "cross_encoder_cache": True}}, model="org/vlm", encoder_hash=h,
            dtype="bfloat16", store=shm("4MiB")) as c:
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


def test_skip_is_truthy_success_and_keeps_its_values():
    """Skip.QUEUED is true and still 0; every reason is false (issue 27)."""
    assert bool(encache.Skip.QUEUED) is True
    assert encache.Skip.QUEUED == 0 and int(encache.Skip.QUEUED) == 0
    for s in encache.Skip:
        if s is not encache.Skip.QUEUED:
            assert not s and s > 0


def test_skipped_publications_counted_and_logged_once(tmp_path):
    import torch
    logs = []
    url = f"shm://sk{tmp_path.name[-8:]}?size=4MiB&create=yes"
    cfg = {"ec_connector_extra_config": {"cross_encoder_cache": True}}
    try:
        with encache.Cache(cfg, model="m", dtype=torch.float32, store=url,
                           log=logs.append) as c:
            items = [encache.Item(i, torch.float32, (4, 8)) for i in "abcd"]
            with c.lookup(items) as s:
                assert not s.publish("a", torch.ones(8, 4).t())
                assert not s.publish("b", torch.ones(8, 4).t())
                assert not s.publish("c", torch.ones(4, 8,
                                                     dtype=torch.float64))
                assert s.publish("d", torch.ones(4, 8))
            skipped = c.stats().published_skipped
            assert skipped["NOT_CONTIGUOUS"] == 2 and skipped["DTYPE"] == 1
    finally:
        encache.shm_destroy(f"sk{tmp_path.name[-8:]}")
    mine = [m for m in logs if "skipped" in m]
    assert len(mine) == 2, logs
    assert mine[0].startswith('publication of "') and "a" in mine[0]
    assert "stats().published_skipped" in mine[0]


def test_typed_package():
    """PEP 561: the package says it is typed, and the compiled part has a
    stub that parses (issue 27)."""
    import ast
    import typing
    here = pathlib.Path(encache.__file__).parent
    assert (here / "py.typed").exists()
    ast.parse((here / "_encache.pyi").read_text())
    hints = typing.get_type_hints(encache.vllm_encoder_hash)
    assert hints["return"] is str
    assert typing.get_type_hints(encache.Cache.__init__)["return"] is \
        type(None)
