# SPDX-License-Identifier: Apache-2.0
"""vLLM finds encache the way it finds any plugin: the installed wheel's
entry point (vllm.general_plugins: encache = encache.vllm:register, from
pyproject.toml), loaded by vLLM's own load_general_plugins()
(vllm/plugins/__init__.py, vLLM 0.32.0: every entry point of the group,
filtered by VLLM_PLUGINS, each function called once per process), which
registers EncacheECConnector with vLLM's ECConnectorFactory.  Each check
runs in a fresh interpreter: the registry and the plugins' "loaded" flag
are per process."""

import importlib.metadata
import json
import os
import subprocess
import sys

PROBE = r"""
import json
from vllm.distributed.ec_transfer.ec_connector.factory import ECConnectorFactory
from vllm.plugins import load_general_plugins
from vllm.config import ECTransferConfig
before = "EncacheECConnector" in ECConnectorFactory._registry
load_general_plugins()
after = "EncacheECConnector" in ECConnectorFactory._registry
cls = None
if after:
    cls = ECConnectorFactory.get_connector_class(ECTransferConfig(
        ec_connector="EncacheECConnector", ec_role="ec_producer"))
    cls = f"{cls.__module__}.{cls.__qualname__}"
print("PROBE", json.dumps({"before": before, "after": after, "class": cls}))
"""


def _probe(**env):
    p = subprocess.run([sys.executable, "-c", PROBE], capture_output=True,
                       text=True, timeout=300, env={**os.environ, **env})
    assert p.returncode == 0, p.stderr[-3000:]
    line = [x for x in p.stdout.splitlines() if x.startswith("PROBE ")][-1]
    return json.loads(line[len("PROBE "):])


def test_the_entry_point_comes_from_the_installed_wheel():
    dist = importlib.metadata.distribution("encache")
    ours = [ep for ep in dist.entry_points
            if ep.group == "vllm.general_plugins"]
    assert [(ep.name, ep.value) for ep in ours] == \
        [("encache", "encache.vllm:register")]
    import encache
    assert dist.version == encache.__version__
    # pip's record, not a hand-kept dist-info
    assert (dist.read_text("INSTALLER") or "").strip() == "pip"


def test_vllms_load_general_plugins_registers_the_connector():
    got = _probe()
    assert got == {"before": False, "after": True,
                   "class": "encache.vllm.connector.EncacheECConnector"}


def test_vllm_plugins_filters_it_as_any_plugin():
    assert _probe(VLLM_PLUGINS="encache")["after"] is True
    assert _probe(VLLM_PLUGINS="some_other_plugin")["after"] is False
