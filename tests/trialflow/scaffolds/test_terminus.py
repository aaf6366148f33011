"""The Terminus-2 agent for real: loop on the host, tmux in a Docker sandbox, the model through
the real proxy backed by the ScriptedVLLM test double (replies in Terminus-2's JSON format)."""

from __future__ import annotations

import json

import pytest

from tests.doubles.scripted_vllm import Reply
from tests.trialflow.conftest import EXAMPLES
from trialflow.scaffolds import ScaffoldContext, get_scaffold
from trialflow.scaffolds.terminus import EXIT_API_ERROR, EXIT_COMPLETE, EXIT_PARSE_FAILURES, EXIT_TIMEOUT
from trialflow.tasks import load_task
from trialflow.verifier import run_verifier

pytestmark = pytest.mark.docker


def reply(commands=(), done=False, analysis="") -> Reply:
    return Reply(
        json.dumps(
            {
                "analysis": analysis,
                "plan": "",
                "commands": [{"keystrokes": k, "duration": d} for k, d in commands],
                "task_complete": done,
            }
        )
    )


async def _run(sandbox_for, scripted_proxy, script, *, timeout_s=120.0, close_first=False, **options):
    proxy, _ = await scripted_proxy(script, default=Reply("unscripted"))
    task = load_task(EXAMPLES / "create-file")
    sandbox = await sandbox_for(task)
    handle = proxy.open_session()
    if close_first:
        await proxy.close_session(handle.session_id)
    beats: list[dict] = []
    ctx = ScaffoldContext(
        sandbox=sandbox,
        task=task,
        openai_base_url=handle.openai_base_url,
        model="tiny",
        timeout_s=timeout_s,
        heartbeat=beats.append,
    )
    result = await get_scaffold("terminus", **options).run(ctx)
    turns = [json.loads(line) for line in result.stdout.splitlines()]
    return proxy, handle, ctx, result, turns, beats


async def test_terminus_solves_create_file(sandbox_for, scripted_proxy):
    script = [
        reply([("printf 'Hello, trialflow!\\n' > hello.txt\n", 0.5)], analysis="empty dir"),
        Reply("I think the file is there now."),  # not JSON: corrected, counted, not fatal
        reply([("cat /app/hello.txt\n", 0.5)], done=True),
        reply(done=True),  # the confirmation
    ]
    proxy, handle, ctx, result, turns, beats = await _run(sandbox_for, scripted_proxy, script)

    assert result.exit_code == EXIT_COMPLETE and not result.timed_out, result.log
    assert [t["turn"] for t in turns] == [1, 2, 3, 4]
    assert turns[1]["parse_error"] == "No valid JSON found in response"  # Harbor's error prompt next
    assert turns[2]["task_complete"] is True and "Hello, trialflow!" in turns[2]["screen"]
    assert len(beats) == 4 and beats[-1]["parse_failures"] == 1
    verdict = await run_verifier(ctx.sandbox, ctx.task)
    assert verdict.reward_valid and verdict.reward == 1.0, verdict.stdout
    trajectory = await proxy.close_session(handle.session_id)
    assert trajectory.counters.turns == 4


async def test_terminus_gives_up_after_malformed_replies_in_a_row(sandbox_for, scripted_proxy):
    script = [Reply("nope"), Reply('{"commands": "ls"}')]
    _, _, _, result, turns, _ = await _run(sandbox_for, scripted_proxy, script, max_parse_failures=2)
    assert result.exit_code == EXIT_PARSE_FAILURES and "2 malformed replies in a row" in result.stderr
    assert result.stop_reason is None  # a parse-failure give-up is not the turn limit
    assert [t["parse_error"] for t in turns] == [
        "No valid JSON found in response",
        "Missing required fields: analysis, plan",
    ]


async def test_terminus_turn_limit(sandbox_for, scripted_proxy):
    script = [reply([("echo one\n", 0.1)]), reply([("echo two\n", 0.1)]), reply()]
    _, _, _, result, turns, _ = await _run(sandbox_for, scripted_proxy, script, max_turns=2)
    assert result.exit_code == 1 and len(turns) == 2 and "turn limit reached (2)" in result.stderr
    assert result.stop_reason == "max_turns"
    assert "two" in turns[-1]["screen"]


async def test_terminus_agent_timeout_is_an_outcome(sandbox_for, scripted_proxy):
    script = [reply([("sleep 100\n", 60)])]
    _, _, ctx, result, _, _ = await _run(sandbox_for, scripted_proxy, script, timeout_s=6)
    assert result.timed_out and result.exit_code == EXIT_TIMEOUT and result.duration_s < 10
    assert "agent timeout" in result.stderr
    # The agent's command does not outlive it.
    ps = await ctx.sandbox.exec(["pgrep", "-f", "sleep 100"])
    assert ps.exit_code == 1, ps.stdout


async def test_terminus_proxy_error_ends_the_run(sandbox_for, scripted_proxy):
    _, _, _, result, turns, _ = await _run(sandbox_for, scripted_proxy, [], close_first=True)
    assert result.exit_code == EXIT_API_ERROR and "NotFound" in result.stderr
    assert len(turns) == 1 and "error" in turns[0]


async def test_terminus_speaks_terminus2_to_the_model(sandbox_for, scripted_proxy):
    """What the model sees is Harbor's Terminus-2 conversation: its prompt as the first user
    message (no system message), new terminal output after commands, its confirmation prompt."""
    proxy, vllm = await scripted_proxy(
        [reply([("echo marker-$((6*7))\n", 0.3)]), reply(done=True), reply(done=True)],
        default=Reply("unscripted"),
    )
    task = load_task(EXAMPLES / "create-file")
    sandbox = await sandbox_for(task)
    handle = proxy.open_session()
    ctx = ScaffoldContext(
        sandbox=sandbox, task=task, openai_base_url=handle.openai_base_url, model="tiny", timeout_s=120
    )
    result = await get_scaffold("terminus").run(ctx)
    assert result.exit_code == EXIT_COMPLETE, result.log
    prompts = [vllm.decode(r["prompt"]) for r in vllm.requests]
    assert len(prompts) == 3
    assert "You are an AI assistant tasked with solving command-line tasks" in prompts[0]
    assert "Task Description:\n" + task.instruction in prompts[0]
    assert "New Terminal Output:" in prompts[1] and "marker-42" in prompts[1]
    assert "Are you sure you want to mark the task as complete?" in prompts[2]
    assert "<|im_start|>system" not in prompts[0]
