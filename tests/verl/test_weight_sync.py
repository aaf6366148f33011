"""verl's weight sync reaches the proxies: verl's REAL CheckpointEngineManager (naive
backend, on a local Ray instance) subclassed by TemporalCheckpointEngineManager broadcasts
the new global step to every proxy registered in the store; a turn running across the
update records both versions."""

from __future__ import annotations

import asyncio
import socket

import aiohttp
import pytest

from proxy.server import ProxyServer
from proxy.session import SessionConfig
from tests.doubles.scripted_vllm import Reply, ScriptedVLLM
from tests.proxy._support import load_tokenizer, pool_over
from trialflow.policy_sync import ProxyEndpoint, register_proxy, registered_proxies, unregister_proxy
from trialflow.storage import LocalStore, proxy_registry_key


@pytest.fixture
def actor_wg(ray_local):
    """The actor worker group's one call the naive backend makes, as a Ray task (the real
    group would push the weights into the colocated rollout engines here)."""

    @ray_local.remote
    def update_weights(global_steps, mode):
        return global_steps, mode

    class ActorGroup:
        calls: list = []

        def update_weights(self, global_steps=None, mode=None):
            ref = update_weights.remote(global_steps, mode)
            self.calls.append(ref)
            return ref

    return ActorGroup()


def _dead_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


async def test_update_weights_broadcasts_the_step_and_a_spanning_turn_records_both(
    tiny_model_dir, tmp_path, actor_wg, ray_local
):
    from verl.workers.config.rollout import CheckpointEngineConfig

    from trialflow.verl.weight_sync import TemporalCheckpointEngineManager

    tok = load_tokenizer(tiny_model_dir)
    store = LocalStore(tmp_path / "store")
    async with ScriptedVLLM(tok, default=Reply("slow", delay_s=1.5)) as dbl:
        srv = ProxyServer(
            tokenizer=tok,
            pool=pool_over(dbl.url),
            defaults=SessionConfig(model="scripted", max_context_tokens=4096, policy_version=4),
        )
        async with srv, aiohttp.ClientSession() as http:
            register_proxy(
                store,
                ProxyEndpoint(worker_id="w1", management_url=srv.management_url, token=srv.management_token),
            )
            register_proxy(store, ProxyEndpoint(worker_id="dead", management_url=_dead_url(), token="x"))
            store.put_bytes(proxy_registry_key("broken"), b"{not json")
            manager = TemporalCheckpointEngineManager(
                config=CheckpointEngineConfig(backend="naive"), actor_wg=actor_wg, replicas=[]
            )
            manager.store = store

            h = srv.open_session()
            turn = asyncio.create_task(
                http.post(
                    h.openai_base_url + "/chat/completions",
                    json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
                )
            )
            while not dbl.requests:  # noqa: ASYNC110 - polling a test double
                await asyncio.sleep(0.02)
            await manager.update_weights(global_steps=5)  # while the turn generates
            assert ray_local.get(actor_wg.calls[-1]) == (5, "naive")  # verl's own sync ran
            assert (await turn).status == 200
            later = srv.open_session()
            traj = await srv.close_session(h.session_id)
            seg = traj.segments[0]
            assert (seg.policy_version_min, seg.policy_version_max) == (4, 5)
            assert srv.session(later.session_id).policy_version == 5  # new sessions start at 5

    endpoints, broken = registered_proxies(store)
    assert sorted(e.worker_id for e in endpoints) == ["dead", "w1"] and list(broken) == [
        proxy_registry_key("broken")
    ]
    unregister_proxy(store, "dead")
    unregister_proxy(store, "dead")  # already gone: fine
    assert [e.worker_id for e in registered_proxies(store)[0]] == ["w1"]


async def test_broadcast_reports_every_proxy_and_never_raises(tiny_model_dir, tmp_path):
    from trialflow.policy_sync import broadcast_policy_version

    tok = load_tokenizer(tiny_model_dir)
    store = LocalStore(tmp_path / "store")
    async with ScriptedVLLM(tok) as dbl:
        srv = ProxyServer(tokenizer=tok, pool=pool_over(dbl.url), defaults=SessionConfig(model="scripted"))
        async with srv:
            srv.open_session()
            register_proxy(
                store,
                ProxyEndpoint(worker_id="w1", management_url=srv.management_url, token=srv.management_token),
            )
            register_proxy(
                store, ProxyEndpoint(worker_id="wrong-token", management_url=srv.management_url, token="nope")
            )
            register_proxy(store, ProxyEndpoint(worker_id="dead", management_url=_dead_url(), token="x"))
            out = await broadcast_policy_version(store, 7, timeout_s=5)
    assert out["w1"] == "ok: 1 sessions"
    assert out["wrong-token"].startswith("HTTP 401") and not out["dead"].startswith("ok")
