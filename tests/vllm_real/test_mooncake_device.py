# SPDX-License-Identifier: Apache-2.0
"""device_name_per_gpu in the Mooncake client JSON, as vLLM 0.34.0 reads
it (vllm/distributed/mooncake_store.py: MooncakeStoreConfig, a list of
device names indexed by physical GPU id that replaces device_name when
set; __post_init__ refuses both set, and an empty list or a blank name;
_device_name_for_current_gpu takes the entry of current_platform.
visible_device_id_to_physical_device_id(the current device index) and
refuses a GPU without one).  vLLM 0.32.0, installed here, has no such
field, so encache's reading is tested directly: the connector hands the
library a copy of the client JSON with device_name set to its GPU's
entry (encache.vllm._core), which encache's own parser reads back."""

import json
import os
import tempfile

import pytest

from conftest import encache_tool, real_config

import encache
from encache.vllm import _core
from encache.vllm import connector as ecc

CLIENT = {"metadata_server": "P2PHANDSHAKE",
          "master_server_address": "127.0.0.1:50051", "protocol": "rdma",
          "mode": "standalone-store", "global_segment_size": 0}
NAMES = ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"]


@pytest.mark.parametrize("gpu", range(4))
def test_the_gpus_entry_replaces_device_name(gpu):
    got = _core.mooncake_client_for_gpu(
        dict(CLIENT, device_name_per_gpu=NAMES), gpu)
    assert got == dict(CLIENT, device_name=NAMES[gpu])
    # an empty device_name beside it is no conflict (vLLM: "if
    # self.device_name")
    assert _core.mooncake_client_for_gpu(dict(
        CLIENT, device_name="", device_name_per_gpu=NAMES), lambda: gpu) \
        == got


@pytest.mark.parametrize("client, message", [
    (dict(CLIENT, device_name="mlx5_0", device_name_per_gpu=NAMES),
     "not both"),
    (dict(CLIENT, device_name_per_gpu=[]), "non-empty list"),
    (dict(CLIENT, device_name_per_gpu=["mlx5_0", " "]), "non-empty list"),
    (dict(CLIENT, device_name_per_gpu="mlx5_0"), "non-empty list"),
    (dict(CLIENT, device_name_per_gpu=NAMES[:2]), "physical GPU 2"),
])
def test_what_vllm_refuses_is_refused(client, message):
    with pytest.raises(encache.ConfigError, match=message):
        _core.mooncake_client_for_gpu(client, 2)


def test_without_it_nothing_changes():
    assert _core.mooncake_client_for_gpu(dict(CLIENT), 0) is None
    assert _core.mooncake_client_for_gpu(
        dict(CLIENT, device_name_per_gpu=None), 0) is None
    with pytest.raises(encache.ConfigError, match="no GPU"):
        _core.mooncake_client_for_gpu(dict(
            CLIENT, device_name_per_gpu=NAMES), None)


def _check(path):
    """encache's own parser's view of a client JSON (encache config)."""
    out = encache_tool("config", "check", "--ec-transfer-config",
                       '{"ec_connector": "EncacheECConnector", '
                       '"ec_role": "ec_producer"}',
                       "--mooncake-config", path).stdout.decode()
    lines = {ln.split("=")[0].strip(): ln.split("=", 1)[1].strip()
             for ln in out.splitlines() if "=" in ln}
    return lines, out


@pytest.mark.parametrize("form", ["path", "env", "tier"])
def test_the_library_gets_the_gpus_device_name(tmp_path, monkeypatch,
                                               form):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "copies"))
    os.mkdir(tmp_path / "copies")
    path = str(tmp_path / "mooncake.json")
    with open(path, "w") as f:
        json.dump(dict(CLIENT, device_name_per_gpu=NAMES), f)
    lines, out = _check(path)  # the file as written: an unknown field
    assert "mooncake.device_name_per_gpu" in out.split("unknown options")[1]
    monkeypatch.setenv("MOONCAKE_CONFIG_PATH", path)
    url = {"path": "mooncake:" + path, "env": "mooncake:",
           "tier": "tier:shm://t?size=1MiB+mooncake:"}[form]
    opened, copy = _core._mooncake_url_for_gpu(url, 3)
    try:
        assert opened == url.replace("mooncake:" + path if form == "path"
                                     else "mooncake:", "mooncake:" + copy)
        assert os.path.dirname(copy) == str(tmp_path / "copies")
        lines, out = _check(copy)
        assert lines["mooncake.device_name"] == '"mlx5_3"'
        assert "device_name_per_gpu" not in out
    finally:
        os.unlink(copy)


def test_the_connector_opens_the_copy_and_removes_it(
        model_dir, tmp_path, monkeypatch):
    # The worker's Cache opens mooncake: with the copy (no Mooncake
    # library here: the open fails after the client JSON is read, naming
    # the URL it opened), and the copy is gone after the open.
    copies = tmp_path / "copies"
    os.mkdir(copies)
    monkeypatch.setattr(tempfile, "tempdir", str(copies))
    path = str(tmp_path / "mooncake.json")
    with open(path, "w") as f:
        json.dump(dict(CLIENT, device_name_per_gpu=NAMES), f)
    monkeypatch.setenv("MOONCAKE_CONFIG_PATH", path)
    monkeypatch.setenv("ENCACHE_MOONCAKE_LIBRARY",
                       str(tmp_path / "no-libmooncake_store.so"))
    monkeypatch.delenv("ENCACHE_STORE", raising=False)
    monkeypatch.setattr(ecc, "_physical_gpu", lambda: 1)
    config = real_config(model_dir, extra={"cross_encoder_cache": True,
                                           "inner_ec_connector": "",
                                           "stats_segment": "off"})
    from vllm.distributed.ec_transfer.ec_connector.base import ECConnectorRole
    with pytest.raises(encache.Error) as e:
        ecc.EncacheECConnector(config, ECConnectorRole.WORKER)
    assert f"mooncake:{copies}{os.sep}encache-mooncake-" in str(e.value)
    assert "no-libmooncake_store.so" in str(e.value)
    assert os.listdir(copies) == []
    # a GPU without an entry is refused before anything is opened
    monkeypatch.setattr(ecc, "_physical_gpu", lambda: 9)
    with pytest.raises(encache.ConfigError, match="physical GPU 9"):
        ecc.EncacheECConnector(config, ECConnectorRole.WORKER)


def test_the_physical_gpu_is_found_as_vllm_finds_it(monkeypatch):
    # CUDA_VISIBLE_DEVICES maps the current device index to the physical
    # id through vLLM's own Platform.visible_device_id_to_physical_device_id
    # (vllm/platforms/interface.py); a CUDA platform stands in here, on a
    # machine without a GPU.
    import torch
    import vllm.platforms
    from vllm.platforms.interface import Platform

    class Cuda(Platform):
        device_control_env_var = "CUDA_VISIBLE_DEVICES"

    monkeypatch.setattr(vllm.platforms, "current_platform", Cuda,
                        raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert ecc._physical_gpu() == 3 == \
        Cuda.visible_device_id_to_physical_device_id(1)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert ecc._physical_gpu() == 1
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert ecc._physical_gpu() is None
