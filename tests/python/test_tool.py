# SPDX-License-Identifier: Apache-2.0
"""Interop with the C tool (tools/encache): what Python publishes the tool
reads (same key, same v3 bytes), and what the tool publishes is a HIT in
Python, bit for bit."""
import struct

import pytest

import ectest
from ectest import BF16, DTYPES, lookup_one, publish_one, sample

WIRE = {"float32": 0, "float16": 11, "bfloat16": 12}  # docs/format.md


def _name(dtype):
    return str(dtype).replace("torch.", "")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_tool_reads_what_python_wrote(open_cache, store, dtype):
    c = open_cache(dtype=dtype)
    t = sample(3, 5, dtype)
    publish_one(c, "py-img", t)
    name = _name(dtype)
    ns = ectest.tool("key", "--namespace", "--model", "org/vit", "--dtype",
                     name).stdout.decode().strip()
    assert ns == c.namespace
    key = ectest.tool("key", "--model", "org/vit", "--dtype", name, "--id",
                      "py-img").stdout.decode().strip()
    assert key == c.namespace + "@id:py-img"
    obj = ectest.tool("get", key, store=store).stdout
    assert obj[:24] == struct.pack("<IIQQ", 0x4D4F4F4E, WIRE[name], 3, 5)
    assert obj[24:] == ectest.raw(t).tobytes()
    out = ectest.tool("lookup", "--model", "org/vit", "--dtype", name,
                      "--rows", "3", "--cols", "5", "py-img",
                      store=store).stdout.decode()
    assert out.split() == ["py-img", "HIT", name, "3", "5"], out


def test_python_hits_what_the_tool_published(open_cache, store, tmp_path):
    t = sample(7, 9, BF16)
    payload = tmp_path / "payload"
    payload.write_bytes(ectest.raw(t).tobytes())
    out = ectest.tool("publish", "--model", "org/tool", "--dtype", "bfloat16",
                      "--rows", "7", "--cols", "9", "--id", "tool-img",
                      str(payload), store=store).stdout.decode()
    assert "written" in out, out
    c = open_cache(model="org/tool", dtype=BF16)
    r = lookup_one(c, "tool-img", BF16, (7, 9))
    assert r.hit and ectest.torch_bits_equal(r.tensor, t)
    numpy_cache = open_cache(model="org/tool", dtype="bfloat16",
                             output="numpy")
    r = lookup_one(numpy_cache, "tool-img", BF16, (7, 9))
    assert r.hit and r.tensor.tobytes() == payload.read_bytes()
