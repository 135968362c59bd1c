# SPDX-License-Identifier: Apache-2.0
"""encache.model_identity(): the identity of a model's weights, the same
as the tool's `encache identity`, and new when one byte changes."""
import pytest

import ectest
from ectest import encache


def test_identity_follows_the_weights(tmp_path):
    w = tmp_path / "model.safetensors"
    w.write_bytes(bytes(range(256)) * 64)
    (tmp_path / "config.json").write_text("{}")  # not a weight file
    first = encache.model_identity(str(tmp_path), "vit")
    assert first.startswith("vit@weights:xxh128:")
    assert encache.model_identity(str(tmp_path), "vit") == first
    tool = ectest.tool("identity", "--model-dir", str(tmp_path), "--label",
                       "vit").stdout.decode().strip()
    assert tool == first
    data = bytearray(w.read_bytes())
    data[1000] ^= 1
    w.write_bytes(bytes(data))
    assert encache.model_identity(str(tmp_path), "vit") != first


def test_identity_errors_name_the_directory(tmp_path):
    with pytest.raises(encache.Error, match=str(tmp_path)):
        encache.model_identity(str(tmp_path))  # no weight files
    with pytest.raises(encache.InvalidError):
        encache.model_identity(str(tmp_path), "bad label")
