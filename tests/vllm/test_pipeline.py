# SPDX-License-Identifier: Apache-2.0
"""The connector driven as vLLM drives it (vllm_fakes.Engine: the call
order of vLLM's scheduler and model runner, each call site cited there),
with real tensors on real Stores: shm, Redis when the test script started
one (tests/python/run.sh), the fault-injecting Store (tests/python/
fault_store.c) for outages and unconfirmed I/O."""

import multiprocessing
import os
import pickle
import threading
import time

import pytest
import torch

import encache
import ectest
import vllm_delivery
import vllm_fakes as vf
from encache.vllm import _core
from encache.vllm import connector as ecc


def bits(t):
    return t.contiguous().view(-1).view(torch.int32).tolist()


STORES = ["shm", "redis", "redis-cluster", "tier"]


def store_of(kind, shm):
    if kind == "shm":
        return shm()
    env = "ENCACHE_REDIS_CLUSTER_URL" if kind == "redis-cluster" \
        else "ENCACHE_REDIS_URL"
    url = os.environ.get(env)
    if not url:
        pytest.skip(f"no {env} (tests/vllm/run.sh starts the servers when "
                    "redis-server is installed)")
    if kind == "tier":  # a host's shm in front of the Redis server
        return f"tier:{shm()}+{url}"
    return url


@pytest.mark.parametrize("kind", STORES)
def test_two_encoder_processes_share_hits_bit_for_bit(shm, kind):
    url = store_of(kind, shm)
    images = [ectest.unique("img") for _ in range(3)]
    ctx = multiprocessing.get_context("spawn")
    import vllm_children
    results = []
    for _ in range(2):  # one after the other: the second finds all three
        ours, theirs = ctx.Pipe()
        p = ctx.Process(target=vllm_children.encoder_process,
                        args=(url, images, theirs))
        p.start()
        assert ours.poll(ectest.TIMEOUT), "the encoder process hung"
        results.append(ours.recv())
        p.join(ectest.TIMEOUT)
        assert p.exitcode == 0
    (first_calls, first_bits), (second_calls, second_bits) = results
    assert sorted(first_calls) == sorted(images)
    assert second_calls == []  # every image was a hit
    assert second_bits == first_bits  # NaN, -0.0 and infinities included


def test_hits_go_into_the_encoder_cache_and_delivery_stays_the_inner_ones(
        engines, shm):
    url = shm()
    a = engines(vf.vllm_config(url))
    a.step([vf.request("r1", ["A", "B"])])
    a.worker.shutdown()
    vllm_delivery.CALLS.clear()
    b2 = engines(vf.vllm_config(url))
    [sched, worker] = vllm_delivery.CALLS
    out = b2.step([vf.request("r2", ["A", "C", "B"])])
    assert b2.encoder.calls == ["C"]
    assert bits(b2.encoder_cache["A"]) == bits(a.encoder_cache["A"])
    assert b2.encoder_cache["A"].shape == (4, 8)
    # The inner connector saw the step as vLLM would have called it:
    # its own metadata bound, start_save_caches once the hits were in
    # the encoder cache, save_caches for the output encoded here.
    assert worker.calls[0] == ("bind", {"inner": "meta"})
    assert worker.calls[1] == ("start_save_caches", {"A", "B"})
    assert ("save_caches", "C") in worker.calls
    assert ("save_caches", "A") not in worker.calls
    assert out.finished_sending == {"sent"}
    assert out.ec_connector_worker_meta == "worker-meta"
    assert [c[0] for c in sched.calls].count("has_cache_item") == 3
    # Version-specific hooks reach the inner connector.
    assert b2.scheduler.take_unavailable_requests() == {"r-unavailable"}
    # The inner connector was made with reuse off and its own name, and
    # without encache's options.
    assert worker.name == "RecordingDelivery"
    assert worker.extra["cross_encoder_cache"] is False
    assert "store_url" not in worker.extra


def test_a_hit_encoded_again_by_the_v1_runner_is_not_published_again(
        engines, shm):
    # vLLM's V1 runner encodes the hits encache put in the encoder cache
    # too, and calls save_caches for them: nothing is queued for those
    # (no copy, no existence check), and published counts only C.
    url = shm()
    a = engines(vf.vllm_config(url))
    a.step([vf.request("r1", ["A", "B"])])
    a.worker.shutdown()
    b = engines(vf.vllm_config(url))
    b.v1_runner = True
    b.step([vf.request("r2", ["A", "C", "B"])])
    assert sorted(b.encoder.calls) == ["A", "B", "C"]
    core = b.worker.core
    assert core.counters.loaded == 2
    assert core.counters.published == 1
    assert core.counters.publish_skipped == 2
    core.cache.flush()
    s = core.stats()
    assert (s.published_queued, s.published_written,
            s.published_present) == (1, 1, 0), s


def test_a_second_step_of_the_same_images_is_local(engines, shm):
    e = engines(vf.vllm_config(shm()))
    reqs = [vf.request("r1", ["A"])]
    e.step(reqs)
    e.step(reqs)  # the encoder cache has it: nothing looked up again
    assert e.encoder.calls == ["A"]
    assert e.worker.core.counters.already_local == 1


def test_unplanned_outputs_are_published(engines, shm):
    # Older schedulers plan nothing for what a producer encodes: save_caches
    # alone must publish.
    url = shm()
    a = engines(vf.vllm_config(url))
    out = vf.SchedulerOutput([], {"r1": [0]}, set(),
                             ecc.EncacheECConnectorMetadata(_core.StepPlan()))
    a.run_worker(out, [vf.request("r1", ["U"])])
    assert a.worker.core.counters.unplanned == 1
    a.worker.shutdown()
    b = engines(vf.vllm_config(url))
    b.step([vf.request("r2", ["U"])])
    assert b.encoder.calls == []


def test_reuse_off_encodes_everything_and_opens_no_store(engines, shm):
    e = engines(vf.vllm_config(shm(), cross_encoder_cache=False))
    assert e.worker.core.cache is None and e.worker.namespace is None
    e.step([vf.request("r1", ["A"])])
    e.step([vf.request("r2", ["B"])])
    assert e.encoder.calls == ["A", "B"]


def test_other_modalities_keep_the_encoder_path(engines, shm):
    url = shm()
    a = engines(vf.vllm_config(url))
    a.step([vf.request("r1", ["S"], modality="audio")])
    assert a.worker.core.counters.looked_up == 0


def test_a_store_outage_falls_back_to_encoding(engines, shm, fault):
    url = shm(scheme="pyfault")
    a = engines(vf.vllm_config(url))
    a.step([vf.request("r1", ["A"])])
    a.worker.shutdown()
    b = engines(vf.vllm_config(url))
    fault.answer(fault.READS, fault.UNAVAILABLE)
    b.step([vf.request("r2", ["A"])])  # no exception: encoded instead
    assert b.encoder.calls == ["A"]
    assert b.worker.core.stats().unavailable >= 1
    fault.reset()
    b.step([vf.request("r3", ["B"])])  # and the next step is served again


def test_a_redis_server_that_dies_falls_back_to_encoding(engines, tmp_path):
    if not os.environ.get("ENCACHE_REDIS_URL"):
        pytest.skip("redis-server is not installed")
    server = ectest.RedisServer(tmp_path)
    try:
        a = engines(vf.vllm_config(server.url))
        a.step([vf.request("r1", ["A"])])
        a.worker.core.cache.flush()
        server.kill()
        a2 = engines(vf.vllm_config(server.url))
        a2.step([vf.request("r2", ["A", "B"])])
        assert sorted(a2.encoder.calls) == ["A", "B"]
    finally:
        server.kill()


def test_an_unconfirmed_read_fails_the_worker(engines, shm, fault):
    # The reference: "If native I/O completion ... cannot be established,
    # the worker fails while retaining the affected buffers".
    url = shm(scheme="pyfault")
    a = engines(vf.vllm_config(url))
    a.step([vf.request("r1", ["A"])])
    a.worker.shutdown()
    b = engines(vf.vllm_config(url))
    fault.answer(fault.READS, fault.UNCONFIRMED)
    with pytest.raises(encache.PoisonedError):
        b.step([vf.request("r2", ["A"])])
    fault.reset()
    with pytest.raises(encache.PoisonedError):  # and stays failed
        b.step([vf.request("r3", ["B"])])


def test_single_flight_encodes_a_cold_image_once(engines, shm):
    url = shm()
    opts = {"single_flight": True, "single_flight_wait_ms": 10000}
    a = engines(vf.vllm_config(url, **opts))
    b = engines(vf.vllm_config(url, **opts))
    req = vf.request("r1", ["cold"])
    # a looks up and takes the lease (its step is open, not yet encoded).
    meta = a.scheduler.build_connector_meta(
        vf.SchedulerOutput([vf.NewRequestData("r1", req.mm_features)],
                           {"r1": [0]}, set()))
    a.worker.bind_connector_metadata(meta)
    a.worker.start_save_caches(encoder_cache=a.encoder_cache)
    assert "cold" not in a.encoder_cache
    done = threading.Event()
    t = threading.Thread(target=lambda: (b.step([req]), done.set()))
    t.start()
    assert not done.wait(0.3)  # b waits for a's output
    a.encoder_cache["cold"] = a.encoder("cold", 4)
    a.worker.save_caches(encoder_cache=a.encoder_cache, mm_hash="cold")
    a.worker.clear_connector_metadata()
    a.worker.core.cache.flush()
    t.join(ectest.TIMEOUT)
    assert done.is_set()
    assert a.encoder.calls == ["cold"] and b.encoder.calls == []
    assert bits(b.encoder_cache["cold"]) == bits(a.encoder_cache["cold"])


def test_a_namespace_switch_takes_effect_on_the_next_request(engines, shm):
    url = shm()
    a = engines(vf.vllm_config(url))
    a.step([vf.request("r1", ["A"])])
    old = a.worker.namespace
    new = a.worker.switch_namespace("vit@weights:epoch-2")
    assert new != old and "@model:vit@weights:epoch-2@" in new
    a.encoder_cache.clear()  # vLLM drops its encoder cache with new weights
    a.step([vf.request("r2", ["A"])])  # not the old weights' output
    assert a.encoder.calls == ["A", "A"]
    a.worker.core.cache.flush()  # its publication is written
    b = engines(vf.vllm_config(
        url, embedding_model_identity="vit@weights:epoch-2"))
    assert b.worker.namespace == new
    b.step([vf.request("r3", ["A"])])
    assert b.encoder.calls == []  # published under the new namespace


def test_a_refused_namespace_switch_keeps_the_old_one(engines, shm):
    a = engines(vf.vllm_config(shm()))
    old = a.worker.namespace
    with pytest.raises(encache.InvalidError):
        a.worker.switch_namespace(colour="blue")
    with pytest.raises(encache.ConfigError):
        a.worker.switch_namespace("bad\0identity")
    assert a.worker.namespace == old
    a.step([vf.request("r1", ["A"])])


def test_vllms_validation_and_encaches(shm):
    # vLLM's: reuse with the processor cache off is refused at start-up.
    mc = vf.ModelConfig()
    mc.multimodal_config.mm_processor_cache_gb = 0
    with pytest.raises(ValueError, match="mm_processor_cache_gb"):
        ecc.EncacheECConnector(vf.vllm_config(shm(), model_config=mc),
                               ecc.ECConnectorRole.WORKER)
    # The library's: the store_* limits must be positive, named.
    with pytest.raises(encache.ConfigError, match="store_max_pending_items"):
        ecc.EncacheECConnector(
            vf.vllm_config(shm(), store_max_pending_items=0),
            ecc.ECConnectorRole.WORKER)
    with pytest.raises(encache.ConfigError, match="cross_encoder_cache"):
        ecc.EncacheECConnector(
            vf.vllm_config(shm(), cross_encoder_cache="yes"),
            ecc.ECConnectorRole.SCHEDULER)
    # The connector's own.
    with pytest.raises(encache.ConfigError, match="store_url"):
        ecc.EncacheECConnector(vf.vllm_config(7),
                               ecc.ECConnectorRole.SCHEDULER)


def test_defaults_are_vllms():
    c = _core.ConnectorConfig.from_ec_transfer_config(
        {"ec_connector": "EncacheECConnector", "ec_role": "ec_producer"})
    assert c.enabled is False and c.inner == "ECMooncakeConnector"
    assert c.store_url is None


def test_the_store_defaults_to_mooncake_where_the_reference_is(monkeypatch):
    c = _core.ConnectorConfig.from_ec_transfer_config(
        {"ec_role": "ec_producer"})
    monkeypatch.delenv("ENCACHE_STORE", raising=False)
    monkeypatch.setenv("MOONCAKE_CONFIG_PATH", "mooncake.json")
    assert c.resolved_store() == "mooncake:"
    monkeypatch.setenv("ENCACHE_STORE", "shm://x")
    assert c.resolved_store() is None  # the library reads $ENCACHE_STORE


def test_without_an_inner_connector(engines, shm):
    e = engines(vf.vllm_config(shm(), inner=""))
    assert e.worker._inner is None
    out = e.step([vf.request("r1", ["A"])])
    assert out.finished_sending is None and e.encoder.calls == ["A"]
    assert e.scheduler.has_cache_item("A") is False


def test_the_handle_is_labelled_with_the_instance(engines, shm):
    e = engines(vf.vllm_config(shm()))
    assert ecc._encoder_name(e.config, "worker") == \
        "vllm:engine-0:ec_producer:worker:0"


def test_the_handle_appears_in_encache_stats_with_the_instance(engines, shm):
    # Item 7: the worker's handle in the fleet registry (encache stats,
    # top and the exporter read it) under the vLLM instance's labels.
    segment = ectest.unique("fleet")
    e = engines(vf.vllm_config(shm(), stats_segment=segment))
    e.step([vf.request("r1", ["A"])])
    try:
        out = ectest.tool("stats", "--format", "json", "--segment",
                          segment).stdout.decode()
        assert "vllm:engine-0:ec_producer:worker:0" in out, out
    finally:
        e.worker.shutdown()
        try:  # the registry is a POSIX shared-memory object
            os.unlink(f"/dev/shm/{segment}")
        except FileNotFoundError:
            pass


def test_a_step_left_open_is_closed_by_the_next_bind(engines, shm):
    url = shm()
    a = engines(vf.vllm_config(url))
    a.step([vf.request("r1", ["A"])])
    a.worker.core.cache.flush()
    b = engines(vf.vllm_config(url))
    req = vf.request("r2", ["A"])
    meta = b.scheduler.build_connector_meta(vf.SchedulerOutput(
        [vf.NewRequestData("r2", req.mm_features)], {"r2": [0]}, set()))
    b.worker.bind_connector_metadata(meta)
    b.worker.start_save_caches(encoder_cache={})  # no clear: an error
    cache = {}
    b.worker.bind_connector_metadata(meta)
    b.worker.start_save_caches(encoder_cache=cache)
    assert "A" in cache
    assert b.worker.core.stats().steps_open == 1


def test_the_namespace_is_logged_at_start_up(engines, shm, caplog):
    import logging
    with caplog.at_level(logging.INFO, logger=_core.logger.name):
        e = engines(vf.vllm_config(shm()))
    assert any(e.worker.namespace in r.getMessage() for r in caplog.records)


def test_an_output_wider_than_planned_is_not_published_and_said(
        engines, shm, caplog):
    import logging
    e = engines(vf.vllm_config(shm(), encoder_output_width=16))
    with caplog.at_level(logging.WARNING, logger=_core.logger.name):
        e.step([vf.request("r1", ["A"])])  # the encoder makes 4x8
    assert e.worker.core.counters.published == 0
    assert any("encoder_output_width" in r.getMessage()
               for r in caplog.records)


def test_ec_both_looks_up_once_per_step(engines, shm):
    # ActiveECConnector calls start_save_caches (a producer) and then
    # start_load_caches (a consumer) on an ec_both instance.
    url = shm()
    a = engines(vf.vllm_config(url, role="ec_both"))
    a.step([vf.request("r1", ["A", "B"])])
    a.worker.shutdown()
    vllm_delivery.CALLS.clear()
    b2 = engines(vf.vllm_config(url, role="ec_both"))
    worker = vllm_delivery.CALLS[1]
    b2.step([vf.request("r2", ["A", "B"])])
    assert b2.encoder.calls == [] and b2.worker.core.counters.looked_up == 2
    assert ("start_load_caches", {"A", "B"}) in worker.calls


def test_a_consumer_opens_no_store_and_forwards(engines, shm):
    e = engines(vf.vllm_config(shm(), role="ec_consumer"))
    assert e.worker.core.cache is None
    cache = {}
    e.worker.bind_connector_metadata(
        ecc.EncacheECConnectorMetadata(_core.StepPlan(), {"inner": "meta"}))
    e.worker.start_load_caches(cache)
    e.worker.clear_connector_metadata()
    inner = e.worker._inner
    assert [c[0] for c in inner.calls] == ["bind", "start_load_caches"]


def test_an_output_the_library_refuses_does_not_stop_the_step(engines, shm):
    e = engines(vf.vllm_config(shm()))
    req = vf.request("r1", ["S"])
    meta = e.scheduler.build_connector_meta(vf.SchedulerOutput(
        [vf.NewRequestData("r1", req.mm_features)], {"r1": [0]}, set()))
    e.worker.bind_connector_metadata(meta)
    cache = {}
    e.worker.start_save_caches(encoder_cache=cache)
    cache["S"] = torch.ones(4, 8).to_sparse()  # refused: InvalidError
    e.worker.save_caches(encoder_cache=cache, mm_hash="S")
    e.worker.clear_connector_metadata()
    assert e.worker.core.counters.publish_skipped == 1


def test_start_save_caches_without_an_encoder_cache_defers_the_lookup(
        engines, shm):
    url = shm()
    a = engines(vf.vllm_config(url, role="ec_both"))
    a.step([vf.request("r1", ["A"])])
    a.worker.shutdown()
    b = engines(vf.vllm_config(url, role="ec_both"))
    req = vf.request("r2", ["A"])
    meta = b.scheduler.build_connector_meta(vf.SchedulerOutput(
        [vf.NewRequestData("r2", req.mm_features)], {"r2": [0]}, set()))
    b.worker.bind_connector_metadata(meta)
    b.worker.start_save_caches()  # as some vLLM tests call it
    cache = {}
    b.worker.start_load_caches(cache)
    assert "A" in cache
    b.worker.clear_connector_metadata()


def test_scheduler_prefetch_warms_the_hosts_tier(engines, shm):
    # The scheduler reads the step's candidates when it plans them; on a
    # tier the remote hits are promoted into the host's shm, where the
    # worker's own lookup then finds them.
    redis = os.environ.get("ENCACHE_REDIS_URL")
    if not redis:
        pytest.skip("no Redis server")
    img = ectest.unique("img")
    a = engines(vf.vllm_config(redis))  # an encoder on another host
    a.step([vf.request("r1", [img])])
    a.worker.shutdown()
    local = shm()
    b = engines(vf.vllm_config(f"tier:{local}+{redis}",
                               scheduler_prefetch=True))
    pf = b.scheduler.core.prefetcher
    assert pf is not None
    req = vf.request("r2", [img])
    b.scheduler.build_connector_meta(vf.SchedulerOutput(
        [vf.NewRequestData("r2", req.mm_features)], {"r2": [0]}, set()))
    pf.wait()
    assert pf.prefetched == 1 and pf.failed == 0
    # The host's shm alone (no remote) has it once promoted.
    cfg = ecc.ec_transfer_dict(b.config.ec_transfer_config)
    lib = _core.ConnectorConfig.from_ec_transfer_config(cfg).library_config
    with encache.Cache(lib, store=local,
                       **ecc.namespace_fields(b.config)) as host:
        deadline = time.monotonic() + ectest.TIMEOUT
        while True:
            with host.lookup([(img, torch.float32, (4, 8))]) as step:
                if step[0].hit:
                    assert bits(step[0].tensor) == \
                        bits(a.encoder_cache[img])
                    break
            assert time.monotonic() < deadline, "never promoted"
            time.sleep(0.05)


def test_scheduler_prefetch_is_off_by_default_and_bounded(engines, shm,
                                                          fault):
    e = engines(vf.vllm_config(shm()))
    assert e.scheduler.core.prefetcher is None
    with pytest.raises(encache.ConfigError, match="scheduler_prefetch"):
        _core.ConnectorConfig.from_ec_transfer_config(
            {"ec_connector_extra_config": {"scheduler_prefetch": 1}})
    p = engines(vf.vllm_config(shm(scheme="pyfault"),
                               scheduler_prefetch=True))
    pf = p.scheduler.core.prefetcher
    imgs = [ectest.unique("pf") for _ in range(11)]
    p.step([vf.request("r0", imgs)])  # encoded and published: all present
    p.worker.shutdown()
    pf.wait()  # the step's own prefetch (of 11 misses, then)
    base, dropped = pf.prefetched, pf.dropped
    # The reads held: eight steps' lookups pending, a ninth is dropped
    # rather than wait; submitting never waits for the Store.
    fault.hold(fault.READS)
    t0 = time.monotonic()
    for k in range(8):
        assert pf.submit([(imgs[k], torch.float32, (4, 8))]) is True
    assert pf.submit([(imgs[8], torch.float32, (4, 8))]) is False
    assert time.monotonic() - t0 < ectest.TIMEOUT / 2
    assert pf.dropped == dropped + 1 and pf.prefetched == base
    fault.hold(fault.READS, False)
    pf.wait()
    assert pf.prefetched == base + 8 and pf.failed == 0
    assert pf.submit([(imgs[9], torch.float32, (4, 8))]) is True
    pf.close()
    assert pf.prefetched == base + 9
    assert pf.submit([(imgs[10], torch.float32, (4, 8))]) is False  # closed


def _plan(engine, req):
    """The scheduler half plans req's images (its prefetch starts); the
    SchedulerOutput the worker half then runs, as vf.Engine.step makes
    it."""
    out = vf.SchedulerOutput(
        [vf.NewRequestData(req.request_id, req.mm_features)],
        {req.request_id: list(range(len(req.mm_features)))}, set())
    out.ec_connector_metadata = pickle.loads(pickle.dumps(
        engine.scheduler.build_connector_meta(out)))
    return out


def _published(engines, url, tag, n):
    """n images encoded and published on url by an encoder of their own
    (shut down: its publications written); returns (images, encoder)."""
    imgs = [ectest.unique(tag) for _ in range(n)]
    a = engines(vf.vllm_config(url))
    a.step([vf.request("r1", imgs)])
    a.worker.shutdown()
    return imgs, a


def test_scheduler_prefetch_hands_its_hits_to_the_worker_of_its_process(
        engines, shm, fault):
    # vLLM's single-GPU executor runs the worker in the engine core's
    # process, on the scheduler's thread (vllm/v1/executor/
    # uniproc_executor.py, vLLM 0.32.0):
    # the worker's step takes the hits its scheduler half read when it
    # planned the step, and reads nothing from the Store itself.
    url = shm(scheme="pyfault")
    imgs, a = _published(engines, url, "ho", 3)
    b = engines(vf.vllm_config(url, scheduler_prefetch=True))
    pf, w = b.scheduler.core.prefetcher, b.worker.core
    req = vf.request("r2", imgs)
    out = _plan(b, req)
    pf.wait()
    reads, hits = fault.calls(fault.READS), w.cache.stats().hits
    b.run_worker(out, [req])
    assert fault.calls(fault.READS) == reads  # the worker read nothing
    assert w.cache.stats().hits == hits
    assert w.counters.prefetched == 3 and w.counters.loaded == 3
    assert pf.handed == 3 and pf.prefetched == 3
    for i in imgs:
        assert bits(b.encoder_cache[i]) == bits(a.encoder_cache[i])
    # Each output is handed once: the same images in a later step (the
    # encoder cache emptied) are the worker's own lookups, hits again.
    b.encoder_cache.clear()
    req = vf.request("r3", imgs)
    out = _plan(b, req)
    pf.wait()
    pf._held.clear()  # as if the worker ran after they were dropped
    pf._held_total = 0
    b.run_worker(out, [req])
    assert w.counters.prefetched == 3 and w.cache.stats().hits == hits + 3
    for i in imgs:
        assert bits(b.encoder_cache[i]) == bits(a.encoder_cache[i])


def test_prefetched_hits_encoded_again_by_the_v1_runner_are_not_published(
        engines, shm):
    # The hits the worker took from its scheduler half's prefetch count as
    # loaded by the step, as its own lookup's do.
    url = shm()
    imgs, _ = _published(engines, url, "hv", 3)
    b = engines(vf.vllm_config(url, scheduler_prefetch=True))
    b.v1_runner = True
    pf, w = b.scheduler.core.prefetcher, b.worker.core
    req = vf.request("r2", imgs)
    out = _plan(b, req)
    pf.wait()
    b.run_worker(out, [req])
    assert w.counters.prefetched == 3 and sorted(b.encoder.calls) == \
        sorted(imgs)
    # Not "unplanned" either: no lookup of its own to find them present.
    assert (w.counters.published, w.counters.publish_skipped,
            w.counters.unplanned) == (0, 3, 0)
    assert w.cache.stats().lookups == 0


def test_a_worker_step_waits_for_the_prefetch_of_its_images(engines, shm,
                                                             fault):
    # The worker runs while its scheduler half's prefetch is still reading:
    # it waits for that read rather than read the same objects again.
    url = shm(scheme="pyfault")
    imgs, a = _published(engines, url, "hw", 2)
    b = engines(vf.vllm_config(url, scheduler_prefetch=True))
    pf, w = b.scheduler.core.prefetcher, b.worker.core
    hits = w.cache.stats().hits
    fault.hold(fault.READS)
    req = vf.request("r2", imgs)
    out = _plan(b, req)
    assert fault.wait_held(fault.READS)
    done = threading.Event()
    t = threading.Thread(target=lambda: (b.run_worker(out, [req]),
                                         done.set()))
    t.start()
    assert not done.wait(0.2)  # waiting for the prefetch's read
    fault.hold(fault.READS, False)
    t.join(ectest.TIMEOUT)
    assert done.is_set()
    assert w.counters.prefetched == 2 and w.cache.stats().hits == hits
    for i in imgs:
        assert bits(b.encoder_cache[i]) == bits(a.encoder_cache[i])


def test_a_prefetched_hit_kept_too_long_is_read_again(engines, shm,
                                                      monkeypatch):
    url = shm()
    imgs, a = _published(engines, url, "hs", 2)
    b = engines(vf.vllm_config(url, scheduler_prefetch=True))
    pf, w = b.scheduler.core.prefetcher, b.worker.core
    req = vf.request("r2", imgs)
    out = _plan(b, req)
    pf.wait()
    monkeypatch.setattr(_core, "PREFETCH_HOLD_SECONDS", 0.0)
    b.run_worker(out, [req])
    assert w.counters.prefetched == 0 and w.counters.loaded == 2
    assert pf.evicted == 2 and pf._held_total == 0
    for i in imgs:
        assert bits(b.encoder_cache[i]) == bits(a.encoder_cache[i])


def test_prefetched_hits_are_bounded_and_follow_the_namespace(engines, shm):
    url = shm()
    imgs, a = _published(engines, url, "hb", 3)
    with pytest.raises(encache.ConfigError, match="scheduler_prefetch_bytes"):
        _core.ConnectorConfig.from_ec_transfer_config(
            {"ec_connector_extra_config": {"scheduler_prefetch_bytes": -1}})
    with pytest.raises(encache.ConfigError, match="scheduler_prefetch_bytes"):
        _core.ConnectorConfig.from_ec_transfer_config(
            {"ec_connector_extra_config": {"scheduler_prefetch_bytes": "1"}})
    # 0: nothing is kept for the worker, nothing registered.
    z = engines(vf.vllm_config(url, scheduler_prefetch=True,
                               scheduler_prefetch_bytes=0))
    assert z.scheduler.core.prefetcher.key is None
    z.step([vf.request("r2", imgs)])
    assert z.worker.core.counters.prefetched == 0
    assert z.worker.core.counters.loaded == 3  # its own lookup's hits
    z.shutdown()
    # Room for two of the three outputs (4 x hidden float32 each): the
    # oldest is dropped, the worker reads it itself.
    one = 4 * a.config.model_config.get_hidden_size() * 4
    b = engines(vf.vllm_config(url, scheduler_prefetch=True,
                               scheduler_prefetch_bytes=2 * one))
    pf, w = b.scheduler.core.prefetcher, b.worker.core
    req = vf.request("r3", imgs)
    out = _plan(b, req)
    pf.wait()
    assert pf.evicted == 1 and pf._held_total == 2 * one
    b.run_worker(out, [req])
    assert w.counters.prefetched == 2 and w.counters.loaded == 3
    for i in imgs:
        assert bits(b.encoder_cache[i]) == bits(a.encoder_cache[i])
    # A new namespace on the worker (new weights): what the scheduler half
    # read under the old one is never handed over; the step misses and
    # encodes.
    b.encoder_cache.clear()
    w.switch_namespace(embedding_model_identity="epoch-2")
    req = vf.request("r4", imgs)
    out = _plan(b, req)
    pf.wait()
    held = pf._held_total
    b.run_worker(out, [req])
    assert w.counters.prefetched == 2 and w.counters.loaded == 3
    assert pf._held_total == held > 0
    # Closed: nothing is left registered.
    b.shutdown()
    assert _core._HANDOFFS.get(pf.key) is None
