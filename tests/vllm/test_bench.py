# SPDX-License-Identifier: Apache-2.0
"""python3 -m encache.vllm.bench runs and prints its figures (no figure is
judged here: a benchmark is a program, docs/vllm.md "Cost")."""

import json

from encache.vllm import bench


def test_the_benchmark_runs(capsys):
    assert bench.main(["--iterations", "10", "--json"]) == 0
    figs = json.loads(capsys.readouterr().out)
    assert [f["size"] for f in figs] == ["16 KiB", "1 MiB"]
    assert all(f["bare_p50_us"] > 0 and f["connector_p50_us"] > 0
               for f in figs)
