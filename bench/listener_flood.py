"""A bystander's latency while a neighbour sandbox floods its listeners (issue 20), against
the same bystander idle, in one run on one Docker engine, through the real listeners:

1. egress: two sandboxes on one `Egresses` (allowlist mode, a host server on 127.0.0.2
   standing in for a package index). The bystander makes ``--requests`` sequential GETs
   through its egress proxy, idle and then while the neighbour's two processes open
   connections to theirs as fast as they can for the whole measurement (CONNECT tunnels
   held, and silent connections), against the default cap.
2. session: the real ProxyServer in this process over the ScriptedVLLM double; two
   sessions served into two sandboxes (``serve_session``). The bystander sends
   ``--requests`` sequential one-turn chat completions, idle and then while the neighbour
   posts rounds of 60 concurrent 7.4 MiB bodies.

Client-side per-request times inside the bystander, p50/p90; the ratio loaded / idle is
the result (target p50 <= 1.2x). Also reported: what the flooder got back.

    .venv/bin/python bench/listener_flood.py [--requests 200]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def _stats(values: list[float]) -> dict[str, float]:
    values = sorted(v * 1000 for v in values)
    return {
        "p50_ms": round(statistics.median(values), 3),
        "p90_ms": round(values[int(0.9 * (len(values) - 1))], 3),
    }


async def _run(sandbox, argv: list[str], env: dict[str, str] | None = None, timeout_s: float = 600):
    res = await sandbox.exec(argv, env=env, timeout_s=timeout_s)
    if not res.ok:
        raise RuntimeError(f"{argv[:3]} failed: {res}")
    return [json.loads(line) for line in res.stdout.splitlines()]


async def _compare(probe, flood, settle_s: float = 1.0) -> dict:
    """`probe()` idle, then again while `flood` (a coroutine) runs; the flood must outlast it."""
    [idle] = await probe()
    flooding = asyncio.ensure_future(flood)
    await asyncio.sleep(settle_s)
    [loaded] = await probe()
    outlasted = not flooding.done()
    flooder = await flooding
    a, b = _stats(idle), _stats(loaded)
    return {
        "idle": a,
        "flooded": b,
        "p50_ratio": round(b["p50_ms"] / a["p50_ms"], 3),
        "p90_ratio": round(b["p90_ms"] / a["p90_ms"], 3),
        "flood_outlasted_probe": outlasted,
        "flooder": flooder,
    }


async def main(requests: int, flood_s: float, queued_bytes: int | None = None) -> dict:
    import docker
    from transformers import AutoTokenizer

    from infra import cached_tiny_model
    from proxy.server import ProxyServer
    from proxy.session import SessionConfig
    from tests.doubles.scripted_vllm import Reply, ScriptedVLLM
    from tests.integrity._floods import BODY_FLOOD, CHAT_PROBE, FLOOD, PROBE
    from tests.integrity._support import text_service
    from trialflow.sandbox import DockerBackend
    from trialflow.sandbox.egress import Egresses
    from trialflow.sandbox.network import NetworkPolicy
    from trialflow.tasks import load_task

    backend = DockerBackend(docker.from_env(), labels={"trialflow.bench": uuid.uuid4().hex})
    task = load_task(REPO / "examples" / "tasks" / "create-file")
    sandboxes = [await backend.create(task, trial_id=f"bench-{n}") for n in ("flooder", "bystander")]
    for sb in sandboxes:
        await sb.start()
    flooder, bystander = sandboxes
    upstream, port = await text_service("127.0.0.2", "package index")
    egresses = Egresses()
    tok = AutoTokenizer.from_pretrained(str(cached_tiny_model(REPO / ".cache")))
    double = await ScriptedVLLM(tokenizer=tok, model="tiny", default=Reply("ok")).start()
    proxy = ProxyServer(
        tokenizer=tok,
        replicas=[double.url],
        defaults=SessionConfig(model="tiny"),
        **({"session_max_queued_bytes": queued_bytes} if queued_bytes else {}),
    )
    await proxy.start()
    out: dict = {
        "requests": requests,
        "egress_cap": egresses.limits.max_connections,
        "session_max_queued_bytes": proxy.session_max_queued_bytes,
    }
    try:
        policy = NetworkPolicy("allowlist", ("127.0.0.2",))
        flood_env, env = [await egresses.env_for(sb, policy) for sb in sandboxes]
        egress_port, url = flood_env["http_proxy"].rsplit(":", 1)[1], f"http://127.0.0.2:{port}/simple/"
        flood = " & ".join(
            f'python3 -c "$FLOOD" {kind} {egress_port} 127.0.0.2:{port} {flood_s}'
            for kind in ("tunnel", "silent")
        )
        print("egress ...", file=sys.stderr)
        out["egress"] = await _compare(
            lambda: _run(bystander, ["python3", "-c", PROBE, url, str(requests)], env),
            _run(flooder, ["bash", "-c", flood + " & wait"], {"FLOOD": FLOOD}),
        )
        quiet, noisy = proxy.open_session(), proxy.open_session()
        base = await proxy.serve_session(quiet.session_id, await bystander.listen_loopback())
        noisy_base = await proxy.serve_session(noisy.session_id, await flooder.listen_loopback())
        size = str(int(7.4 * (1 << 20)))
        print("session ...", file=sys.stderr)
        out["session"] = await _compare(
            lambda: _run(bystander, ["python3", "-c", CHAT_PROBE, base, str(requests)]),
            _run(flooder, ["python3", "-c", BODY_FLOOD, noisy_base, "60", size, str(flood_s)]),
        )
    finally:
        await egresses.close_all()
        await upstream.cleanup()
        await proxy.stop()
        await double.stop()
        for sb in sandboxes:
            await sb.stop()
        backend.close()
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=200, help="bystander requests per measurement")
    ap.add_argument(
        "--flood-s", type=float, default=20.0, help="how long each flood runs (must outlast the probe)"
    )
    ap.add_argument(
        "--session-max-queued-bytes",
        type=int,
        help="the session's body bytes in flight (default: the proxy's)",
    )
    args = ap.parse_args()
    print(json.dumps(asyncio.run(main(args.requests, args.flood_s, args.session_max_queued_bytes)), indent=1))
