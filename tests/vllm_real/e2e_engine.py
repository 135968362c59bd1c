# SPDX-License-Identifier: Apache-2.0
"""One vLLM engine of the end-to-end run on the CPU (test_e2e.py runs it
as a process of its own, one after the other).

    python e2e_engine.py '{"role": ..., "model": DIR, ...}'

role "ec_producer": an encoder (mm_encoder_only=True) whose EC connector
is EncacheECConnector, found through encache's vLLM plugin (no module
path), with cross_encoder_cache on the Store `store`; its inner (delivery)
connector is e2e_capture.E2ECaptureConnector, vLLM's ECExampleConnector
writing under `storage`.  role "ec_consumer": a Prefill/Decode engine
whose connector is E2ECaptureConnector itself, reading `storage`.

Each gets the same images (e2e_model.images) in one generate() call.
Before it, a collective_rpc wraps the model's embed_multimodal on the
worker to count the items the encoder computes; after it, another
returns that count, the model runner's class and, on a producer, the
connector's counters (WorkerCore.counters), its Cache's stats (flushed
first: every queued publication written) and its namespace.  All of it,
with the times, goes to `result` as JSON.

The environment (test_e2e.py sets it): HF_HUB_OFFLINE=1 (nothing is
downloaded), VLLM_CPU_KVCACHE_SPACE, VLLM_ALLOW_INSECURE_SERIALIZATION=1
(collective_rpc with a function), PYTHONPATH with this directory (the
worker imports e2e_capture), ENCACHE_E2E_CAPTURE.
"""

from __future__ import annotations

import json
import sys
import time


def install_counter(worker):
    """On the worker: counts the items the model's encoder computes
    (embed_multimodal, which both of vLLM's runners call to encode)."""
    runner = worker.model_runner
    model = runner.model
    counts = {"calls": 0, "items": 0}
    encode = model.embed_multimodal

    def counted(*args, **kwargs):
        out = encode(*args, **kwargs)
        counts["calls"] += 1
        counts["items"] += len(out)
        return out

    model.embed_multimodal = counted
    worker.encache_e2e_counts = counts
    cls = type(runner)
    return f"{cls.__module__}.{cls.__qualname__}"


def read_state(worker):
    """On the worker: the encoder's count and the connector's state."""
    import dataclasses

    from vllm.distributed.ec_transfer import get_ec_transfer

    ec = get_ec_transfer()
    out = {"encoder": dict(worker.encache_e2e_counts),
           "connector": type(ec).__name__}
    core = getattr(ec, "core", None)
    if core is not None and getattr(core, "cache", None) is not None:
        core.cache.flush()
        out["counters"] = dataclasses.asdict(core.counters)
        out["stats"] = json.loads(json.dumps(
            dataclasses.asdict(core.stats()), default=str))
        out["namespace"] = ec.namespace
    return out


def main(args: dict) -> None:
    t0 = time.monotonic()
    from vllm import LLM, SamplingParams
    from vllm.config import ECTransferConfig

    import e2e_model

    producer = args["role"] == "ec_producer"
    if producer:
        ec = ECTransferConfig(
            ec_connector="EncacheECConnector", ec_role="ec_producer",
            ec_connector_extra_config={
                "cross_encoder_cache": True,
                "embedding_cache_prefix": "encache-e2e",
                "store_url": args["store"],
                "inner_ec_connector": "E2ECaptureConnector",
                "inner_ec_connector_module_path": "e2e_capture",
                "shared_storage_path": args["storage"]})
    else:
        ec = ECTransferConfig(
            ec_connector="E2ECaptureConnector", ec_role="ec_consumer",
            ec_connector_module_path="e2e_capture",
            ec_connector_extra_config={"shared_storage_path": args["storage"]})
    t_import = time.monotonic()
    llm = LLM(model=args["model"], load_format="dummy", dtype="float32",
              enforce_eager=True, max_model_len=256, max_num_seqs=4, seed=0,
              mm_encoder_only=producer, limit_mm_per_prompt={"image": 1},
              ec_transfer_config=ec)
    t_up = time.monotonic()
    [runner] = llm.collective_rpc(install_counter)
    prompts = [{"prompt": "<image>\nhi", "multi_modal_data": {"image": im}}
               for im in e2e_model.images(args.get("images", 3))]
    outs = llm.generate(prompts, SamplingParams(max_tokens=2, temperature=0,
                                                ignore_eos=True),
                        use_tqdm=False)
    t_gen = time.monotonic()
    [state] = llm.collective_rpc(read_state)
    result = {
        "role": args["role"], "runner": runner, **state,
        "outputs": [{"finished": o.finished,
                     "tokens": [list(c.token_ids) for c in o.outputs]}
                    for o in outs],
        "seconds": {"import": round(t_import - t0, 1),
                    "engine_up": round(t_up - t_import, 1),
                    "generate": round(t_gen - t_up, 1)},
    }
    with open(args["result"], "w") as f:
        json.dump(result, f, indent=1)
    print("e2e_engine:", json.dumps(result), flush=True)


if __name__ == "__main__":  # vLLM spawns its engine core: this guard is needed
    main(json.loads(sys.argv[1]))
