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


def test_the_prefetch_benchmark_runs(capsys):
    import os

    import pytest
    redis = os.environ.get("ENCACHE_REDIS_URL")
    if not redis:
        pytest.skip("no Redis server")
    assert bench.main(["--iterations", "10", "--json", "--prefetch",
                       "--redis", redis, "--rounds", "3",
                       "--gap-ms", "1"]) == 0
    figs = json.loads(capsys.readouterr().out)["prefetch"]
    modes = [m for m, _, _ in bench.PREFETCH_MODES]
    assert [(f["mode"], f["size"], f["gap_ms"]) for f in figs] == \
        [(m, s, 1.0) for m in modes for s in ("1 MiB", "8 MiB")]
    assert all(f["read_p50_us"] > 0 and f["prefetched_p50_us"] > 0
               for f in figs)
    # The floor (the host's shm alone) is measured where the worker is in
    # another process, the only shape whose step still reads.
    assert all((f["local_p50_us"] is not None) ==
               (f["mode"] == "tier, two processes") for f in figs)
