"""What sandbox isolation costs (issue 9), measured in one run on one Docker engine.

1. Setup time per trial: ``DockerBackend.create`` + ``start`` of the ``create-file`` task,
   isolated (``--network none`` + the session listener opened inside the namespace,
   ``Sandbox.listen_loopback``) vs not (``SandboxPolicy(isolate_network=False)``: host
   networking, no listener). Both with the same hardening (pids limit, caps, NNP).
   Alternating, after one warm-up of each. Target: isolated <= +0.2 s per trial.
   Also reported: ``stop_processes`` (what verification now does first).
2. Proxy added latency, forwarder vs direct: the real ProxyServer in this process over the
   ScriptedVLLM double; a Python client inside a sandbox sends ``--requests`` sequential
   keep-alive requests (``GET /v1/models`` and a one-turn ``POST /v1/chat/completions``):
   ``forwarder`` = an isolated sandbox through its in-namespace listener
   (``ProxyServer.serve_session``), ``direct`` = a host-network sandbox to the proxy's own
   port. Client-side per-request times, p50/p90. Target: forwarder <= +0.3 ms p50.

    .venv/bin/python bench/isolation.py [--trials 10] [--requests 300]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

CLIENT = r"""
import http.client, json, sys, time
host, port, prefix, n = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
conn = http.client.HTTPConnection(host, port, timeout=30)
chat = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
out = {"models": [], "chat": []}
for kind in ("models", "chat"):
    for i in range(n + 20):
        t0 = time.perf_counter()
        if kind == "models":
            conn.request("GET", prefix + "/v1/models")
        else:
            conn.request("POST", prefix + "/v1/chat/completions", body=chat,
                         headers={"Content-Type": "application/json"})
        r = conn.getresponse(); r.read()
        assert r.status == 200, r.status
        if i >= 20:  # warm-up
            out[kind].append((time.perf_counter() - t0) * 1000)
print(json.dumps(out))
"""


def _stats(values: list[float]) -> dict[str, float]:
    values = sorted(values)
    return {
        "p50": round(statistics.median(values), 4),
        "p90": round(values[int(0.9 * (len(values) - 1))], 4),
        "min": round(values[0], 4),
        "n": len(values),
    }


async def setup_times(trials: int) -> dict:
    import docker

    from trialflow.sandbox import DockerBackend
    from trialflow.sandbox.policy import SandboxPolicy
    from trialflow.tasks import load_task

    client = docker.from_env()
    task = load_task(REPO / "examples" / "tasks" / "create-file")
    label = {"trialflow.bench": f"isolation-{uuid.uuid4().hex[:6]}"}
    backends = {
        "isolated": DockerBackend(client, labels=label),
        "host": DockerBackend(client, labels=label, policy=SandboxPolicy(isolate_network=False)),
    }
    times: dict[str, list[float]] = {"isolated": [], "host": [], "stop_processes": []}
    try:
        for i in range(trials + 1):
            for mode, backend in backends.items():
                t0 = time.perf_counter()
                sb = await backend.create(task, trial_id=f"bench-{mode}")
                await sb.start()
                if mode == "isolated":
                    (await sb.listen_loopback()).close()
                took = time.perf_counter() - t0
                t1 = time.perf_counter()
                await sb.stop_processes()
                stop_s = time.perf_counter() - t1
                await sb.stop()
                if i > 0:  # the first round builds/warms the image
                    times[mode].append(took)
                    times["stop_processes"].append(stop_s)
    finally:
        for backend in backends.values():
            await backend.reap(0)
            backend.close()
    out = {
        k: {"median_s": round(statistics.median(v), 4), "min_s": round(min(v), 4)} for k, v in times.items()
    }
    out["added_median_s"] = round(out["isolated"]["median_s"] - out["host"]["median_s"], 4)
    return out


async def latency(requests: int) -> dict:
    import docker
    from transformers import AutoTokenizer

    from infra import cached_tiny_model
    from proxy.server import ProxyServer
    from proxy.session import SessionConfig
    from tests.doubles.scripted_vllm import Reply, ScriptedVLLM
    from trialflow.sandbox import DockerBackend
    from trialflow.sandbox.policy import SandboxPolicy
    from trialflow.tasks import load_task

    model_dir = cached_tiny_model(REPO / ".cache")
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    double = await ScriptedVLLM(tokenizer=tok, model="tiny", default=Reply("ok")).start()
    proxy = ProxyServer(tokenizer=tok, replicas=[double.url], defaults=SessionConfig(model="tiny"))
    await proxy.start()
    client = docker.from_env()
    task = load_task(REPO / "examples" / "tasks" / "create-file")
    label = {"trialflow.bench": f"isolation-{uuid.uuid4().hex[:6]}"}
    backends = {
        "forwarder": DockerBackend(client, labels=label),
        "direct": DockerBackend(client, labels=label, policy=SandboxPolicy(isolate_network=False)),
    }
    raw: dict[str, dict[str, list[float]]] = {m: {"models": [], "chat": []} for m in backends}
    try:
        for _round in range(3):  # alternating modes, so drift hits both alike
            for mode, backend in backends.items():
                sb = await backend.create(task, trial_id=f"bench-{mode}")
                await sb.start()
                handle = proxy.open_session()
                if mode == "forwarder":
                    base = await proxy.serve_session(handle.session_id, await sb.listen_loopback())
                    host, port = base.removeprefix("http://").split(":")
                    prefix = ""
                else:
                    host, port, prefix = (
                        "127.0.0.1",
                        str(proxy.port),
                        f"/s/{handle.session_id}/{handle.secret}",
                    )
                res = await sb.exec(
                    ["python3", "-c", CLIENT, host, port, prefix, str(requests)], timeout_s=600
                )
                if not res.ok:
                    raise RuntimeError(f"{mode}: {res.stderr[-2000:]}")
                for kind, values in json.loads(res.stdout).items():
                    raw[mode][kind] += values
                await proxy.close_session(handle.session_id)
                await sb.stop()
        results: dict[str, dict] = {m: {k: _stats(v) for k, v in kinds.items()} for m, kinds in raw.items()}
    finally:
        for backend in backends.values():
            await backend.reap(0)
            backend.close()
        await proxy.stop()
        await double.stop()
    for kind in ("models", "chat"):
        results[f"added_p50_ms_{kind}"] = round(
            results["forwarder"][kind]["p50"] - results["direct"][kind]["p50"], 4
        )
    return results


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--requests", type=int, default=300)
    args = parser.parse_args()
    started = time.time()
    out = {
        "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(started)),
        "loadavg_before": os.getloadavg(),
        "setup": await setup_times(args.trials),
        "latency_ms": await latency(args.requests),
    }
    out["wall_s"] = round(time.time() - started, 1)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    asyncio.run(main())
