"""Resume by replay: a worker SIGKILLed at turn k of N; the next attempt replays turns 1..k-1.

Real Temporal, Docker, SeaweedFS and `python worker_main.py` processes; the model is the
scripted vLLM double (in this test process), deterministic (its reply is a function of the
prompt) and counting the generations it answers. The scaffold (`ToolLoopScaffold`, loaded by
the workers by its import path) runs N tool-call turns over the proxy's OpenAI
route; every tool call runs in the sandbox and changes its state (a step log), so a fresh
sandbox reaches the same state only by replaying the calls.

Checks: the trial completes as attempt 2 with reward 1; turns 1..k-1 are replayed (the
double answers none of them), k..N generated; the final trajectory equals token for token
an uninterrupted run's. A tool whose output changes at turn j in the second attempt (the
``DRIFT`` file, read by the scaffold) makes the session go live from the request carrying
it, and the trajectory equals an uninterrupted run with that output. The real Claude Code
CLI (the ``claude-code`` scaffold, in the sandbox) killed at main turn K resumes the same way.
``replay --from-record`` of a finished trial reproduces it with the double stopped, and
reports the first divergent request once a task file changes.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

import aiohttp
import pytest

from proxy.trajectory import Trajectory
from tests._worker_fixtures import start_worker_process
from tests.doubles.scripted_vllm import Reply, ScriptedVLLM
from tests.proxy._support import token_view
from trialflow import batch
from trialflow.scaffolds import Scaffold, ScaffoldContext, ScaffoldResult
from trialflow.settings import load_settings
from trialflow.storage import TrialKeys, open_store

REPO = Path(__file__).resolve().parents[1]
TASK = REPO / "examples" / "tasks" / "create-file"
N = 8
K = N // 2  # the kill lands while turn K (1-based) is being generated
DRIFT_ENV = "TRIALFLOW_TEST_TOOL_DRIFT"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "shell",
            "description": "Run a shell command in the sandbox",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
        },
    }
]

SCAFFOLD = f"{__name__}:ToolLoopScaffold"  # an import path: the workers load it too

pytestmark = [pytest.mark.temporal, pytest.mark.docker, pytest.mark.s3]


class ToolLoopScaffold(Scaffold):
    """Test scaffold: N turns; each answer's shell call runs in the sandbox, its output goes back.
    A drift file (path in ``$TRIALFLOW_TEST_TOOL_DRIFT``) holding a turn number j appends a
    marker to turn j's tool output: the injected environment change."""

    name = "test-tool-loop"
    needs_model = True
    runs_in_sandbox = False  # it talks to the proxy from the worker; its tool runs in the sandbox

    async def run(self, ctx: ScaffoldContext) -> ScaffoldResult:
        started = time.monotonic()
        drift_file = Path(os.environ.get(DRIFT_ENV, "/nonexistent"))

        def drifts(turn: int) -> bool:
            return drift_file.exists() and drift_file.read_text().strip() == str(turn)

        messages: list[dict] = [{"role": "user", "content": ctx.instruction}]
        async with aiohttp.ClientSession() as http:
            for turn in range(N):
                body = {"model": ctx.model, "messages": messages, "tools": TOOLS}
                async with http.post(f"{ctx.openai_base_url}/chat/completions", json=body) as resp:
                    if resp.status != 200:
                        return ScaffoldResult(1, False, "", await resp.text(), time.monotonic() - started)
                    message = (await resp.json())["choices"][0]["message"]
                call = message["tool_calls"][0]
                command = json.loads(call["function"]["arguments"])["command"]
                res = await ctx.sandbox.exec(command, timeout_s=30)
                output = res.stdout
                if await asyncio.to_thread(drifts, turn):
                    output += " (drift)"
                messages += [
                    {"role": "assistant", "content": message["content"], "tool_calls": message["tool_calls"]},
                    {"role": "tool", "tool_call_id": call["id"], "content": output},
                ]
        return ScaffoldResult(0, False, f"{N} turns", "", time.monotonic() - started)


class Model:
    """The double's reply function: a shell call that depends on the whole prompt. `arm(k)` makes
    the k-th request from now hang (the worker is killed meanwhile) and sets `reached`."""

    def __init__(self) -> None:
        self.countdown: int | None = None
        self.reached = asyncio.Event()

    def arm(self, k: int) -> None:
        self.countdown, self.reached = k, asyncio.Event()

    def __call__(self, prompt: str) -> Reply:
        h = hashlib.sha256(prompt.encode()).hexdigest()[:8]
        command = (
            f"printf 'Hello, trialflow!\\\\n' > /app/hello.txt; echo {h} >> /tmp/steps; "
            "cat /app/data/seed.txt 2>/dev/null; wc -l < /tmp/steps"
        )
        return self._reply(
            f'<tool_call>\n{{"name": "shell", "arguments": {{"command": "{command}"}}}}\n</tool_call>'
        )

    def _reply(self, text: str) -> Reply:
        """``text``, or a hanging reply when the armed countdown reaches this request."""
        delay = 0.0
        if self.countdown is not None:
            self.countdown -= 1
            if self.countdown == 0:
                self.countdown = None
                self.reached.set()
                delay = 15.0  # the worker dies meanwhile; the double then drops it, uncounted
        return Reply(text, delay_s=delay)


class ClaudeModel(Model):
    """The model for the real Claude Code CLI: on its main loop (prompts carrying its Bash tool)
    N - 1 Bash calls, then a final text; its side calls (title, quota) get a short text and do
    not count towards the armed countdown. ``main_calls`` counts main-loop requests."""

    main_calls = 0

    def __call__(self, prompt: str) -> Reply:
        if '"name": "Bash"' not in prompt:
            return Reply("Greeting")
        self.main_calls += 1
        done = prompt.count("<|im_start|>user\n<tool_response>")
        if done >= N - 1:
            return self._reply("The file is written.")
        command = (
            f"printf 'Hello, trialflow!\\\\n' > /app/hello.txt; echo step{done} >> /tmp/steps; "
            "wc -l < /tmp/steps"
        )
        args = f'{{"command": "{command}", "description": "step {done}"}}'
        return self._reply(f'<tool_call>\n{{"name": "Bash", "arguments": {args}}}\n</tool_call>')


@pytest.fixture
async def rig(temporal_address, s3_endpoint, docker_client, tiny_model_dir, tmp_path):
    """(double, model, run-a-trial, kill-and-resume) over real workers."""
    from transformers import AutoTokenizer

    from infra.base_image import ensure_base_image

    ensure_base_image(docker_client)
    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    model = Model()
    dbl = await ScriptedVLLM(tok, default=model, max_model_len=400_000).start()
    suffix = uuid.uuid4().hex[:8]
    fields = {
        "temporal_address": temporal_address,
        "task_queue": f"resume-{suffix}",
        "s3_endpoint": s3_endpoint.endpoint_url,
        "s3_bucket": s3_endpoint.bucket,
        "s3_prefix": f"resume-{suffix}",
        "s3_access_key": s3_endpoint.access_key,
        "s3_secret_key": s3_endpoint.secret_key,
        "replica_urls": json.dumps([dbl.url]),
        "model_dir": str(tiny_model_dir),
        "model_name": "scripted",
        "drain_grace_s": "10",
    }
    drift = tmp_path / "drift"
    env = {
        **os.environ,
        DRIFT_ENV: str(drift),
        **{f"TRIALFLOW_{k.upper()}": str(v) for k, v in fields.items()},
    }
    settings = load_settings(**{k: json.loads(v) if k == "replica_urls" else v for k, v in fields.items()})
    store = open_store(settings)
    client = await batch.connect(temporal_address)
    workers: list[subprocess.Popen] = []

    def start(name: str) -> subprocess.Popen:
        proc = start_worker_process(env, f"{name}-{suffix}", tmp_path / f"{name}.log")
        workers.append(proc)
        return proc

    async def run(batch_id: str, task: Path = TASK, scaffold: str = SCAFFOLD):
        spec = batch.make_specs(
            batch_id, [task], scaffold, heartbeat_timeout_s=6, host_schedule_timeout_s=10
        )[0]
        [handle] = await batch.submit(client, [spec], task_queue=settings.task_queue)
        return spec, handle

    class Rig:
        pass

    r = Rig()
    r.dbl, r.model, r.store, r.drift, r.start, r.run, r.logs = dbl, model, store, drift, start, run, tmp_path
    r.settings = settings
    try:
        yield r
    finally:
        for proc in workers:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        await dbl.stop()


async def _finish(handle, spec):
    return await asyncio.wait_for(batch.wait_one(handle, spec), timeout=240)


def _final(rig, result) -> Trajectory:
    return Trajectory.from_bytes(rig.store.get_bytes(result.trajectory_uris[-1]))


async def _crash_at_k(
    rig, worker: subprocess.Popen, batch_id: str, drift_at: int | None = None, scaffold: str = SCAFFOLD,
    task: Path = TASK,
):  # fmt: skip
    """Submit a trial, SIGKILL `worker` while turn K is generated, optionally inject the drift,
    start another worker; return (spec, result, generations the double answered after the kill)."""
    rig.model.arm(K)
    spec, handle = await rig.run(batch_id, task, scaffold=scaffold)
    await asyncio.wait_for(rig.model.reached.wait(), timeout=180)
    keys1 = TrialKeys(spec.batch_id, spec.trial_id, 1)
    deadline = time.monotonic() + 30  # turn K-1's checkpoint is written before turn K starts
    while len(rig.store.list_keys(keys1.checkpoints + "/")) < K - 1:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.1)
    worker.send_signal(signal.SIGKILL)
    worker.wait()
    if drift_at is not None:
        rig.drift.write_text(str(drift_at))
    before = rig.dbl.answered
    survivor = rig.start(f"after-{batch_id}")
    result = await _finish(handle, spec)
    return spec, result, rig.dbl.answered - before, survivor


async def test_sigkill_at_turn_k_resumes_by_replay_token_exact(rig):
    first = rig.start("first")
    spec_a, handle_a = await rig.run("reference")
    ref = await _finish(handle_a, spec_a)
    assert (ref.error, ref.attempts, ref.reward, ref.turns) == (None, 1, 1.0, N)
    assert (ref.replayed_turns, ref.generated_turns) == (0, N)

    spec, result, answered, _ = await _crash_at_k(rig, first, "crashed")
    assert result.error is None, result.error
    assert (result.attempts, result.termination_reason, result.reward) == (2, "submitted", 1.0)
    # turns 1..K-1 came from attempt 1's record: the double generated only K..N
    assert (result.turns, result.replayed_turns, result.generated_turns) == (N, K - 1, N - K + 1)
    assert answered == N - K + 1
    final = _final(rig, result)
    assert [t.source for t in final.turns] == ["replayed"] * (K - 1) + ["generated"] * (N - K + 1)
    assert final.metadata["replay"]["divergence"]["reason"] == "record ended"
    # one exact trajectory, token for token the uninterrupted run's
    assert token_view(final) == token_view(_final(rig, ref))
    assert result.trajectory_uris[0].endswith("/attempt-1/checkpoints/")


async def test_a_tool_output_changing_at_turn_j_goes_live_from_there_and_stays_exact(rig):
    j = 1  # 0-based turn whose tool output drifts in attempt 2; request j + 1 carries it
    first = rig.start("first")
    spec, result, answered, _survivor = await _crash_at_k(rig, first, "drifted", drift_at=j)
    assert result.error is None and result.attempts == 2 and result.reward == 1.0
    assert (result.replayed_turns, result.generated_turns) == (j + 1, N - j - 1)
    assert answered == N - j - 1
    final = _final(rig, result)
    div = final.metadata["replay"]["divergence"]
    assert (div["turn"], div["reason"], div["recorded_turn"]) == (j + 1, "prompt differs", j + 1)
    assert len(final.segments) == 1  # the recorded prefix held: the same segment went on live
    # the record is exact: an uninterrupted run with the drifted tool (drift file still there)
    spec_d, handle_d = await rig.run("drift-reference")
    ref = await _finish(handle_d, spec_d)
    assert ref.attempts == 1 and ref.replayed_turns == 0
    assert token_view(final) == token_view(_final(rig, ref))


def seeded_task(root: Path) -> tuple[Path, Path]:
    """A copy of TASK whose image holds /app/data/seed.txt ("alpha"; the model's calls cat it):
    (the task directory, the seed file to change)."""
    import shutil

    task = root / "seeded-task"
    shutil.copytree(TASK, task)
    (task / "environment" / "data").mkdir()
    seed = task / "environment" / "data" / "seed.txt"
    seed.write_text("alpha\n")
    (task / "environment" / "Dockerfile").write_text(
        "FROM trialflow-base:bookworm\nWORKDIR /app\nCOPY data/ /app/data/\n"
    )
    return task, seed


async def test_replay_from_record_reproduces_without_a_replica_and_finds_a_changed_task_file(
    rig, tmp_path, capsys
):
    """`trialflow replay TRIAL --from-record` (its command function): a finished trial re-run
    with the double stopped (no replica at all) reproduces; after a task file changes, the
    first request carrying that file's content is reported, with the diff."""
    from trialflow.cli._record import replay_record

    task, seed = seeded_task(tmp_path)
    rig.start("first")
    spec, handle = await rig.run("recorded", task)
    result = await _finish(handle, spec)
    assert (result.error, result.reward, result.turns) == (None, 1.0, N)
    await rig.dbl.stop()  # from here on no replica exists
    capsys.readouterr()

    code = await asyncio.to_thread(replay_record, rig.settings, spec.trial_id, attempt=None, task=None)
    out = capsys.readouterr().out
    assert code == 0, out
    assert f"replayed {N} of {N} recorded turns; no divergence" in out

    seed.write_text("beta\n")  # the task's environment changed: turn 0's tool output differs
    code = await asyncio.to_thread(replay_record, rig.settings, spec.trial_id, attempt=None, task=None)
    out = capsys.readouterr().out
    assert code == 1, out
    assert f"replayed 1 of {N} recorded turns; diverged" in out
    assert "request 1 differs from recorded turn 1" in out
    assert "-alpha" in out and "+beta" in out


CLAUDE = REPO / ".cache" / "scaffolds" / "node_modules" / ".bin" / "claude"


@pytest.mark.scaffold_cli
@pytest.mark.skipif(
    not CLAUDE.exists() and os.environ.get("CI") != "true", reason="Claude Code not installed"
)
async def test_claude_code_sigkill_at_turn_k_resumes_by_replay(rig):
    """The real Claude Code CLI in the sandbox: killed at main turn K of N, resumed by replay."""
    rig.model = rig.dbl.default = model = ClaudeModel()
    first = rig.start("first")
    spec_a, handle_a = await rig.run("cc-reference", scaffold="claude-code")
    ref = await _finish(handle_a, spec_a)
    assert (ref.error, ref.attempts, ref.reward) == (None, 1, 1.0), (ref, _final(rig, ref).turns)
    ref_traj = _final(rig, ref)
    ref_main = [t for t in ref_traj.turns if ref_traj.segments[t.segment].kind == "main"]
    assert len(ref_main) == N and model.main_calls == N

    model.main_calls = 0
    spec, result, _answered, _ = await _crash_at_k(rig, first, "cc-crashed", scaffold="claude-code")
    calls_before_kill = K  # turns 1..K-1 answered, turn K hung
    assert result.error is None, result.error
    assert (result.attempts, result.reward) == (2, 1.0)
    final = _final(rig, result)
    main = [t for t in final.turns if final.segments[t.segment].kind == "main"]
    assert [t.source for t in main] == ["replayed"] * (K - 1) + ["generated"] * (N - K + 1), final.metadata
    # the double generated only main turns K..N in attempt 2: none for the replayed ones
    assert model.main_calls - calls_before_kill == N - K + 1
    assert result.replayed_turns >= K - 1
    main_view = [v for v in token_view(final) if v[0] == "main"]
    assert main_view == [v for v in token_view(ref_traj) if v[0] == "main"]
