"""The real Claude Code CLI (npm, 2.1.x) against the proxy, on the host.

The scripted vLLM double plays the model: on the main conversation (requests whose prompt
carries Claude Code's Bash tool) it first calls Bash to write a file, then answers with
text. Claude Code's side calls (title generation and the like; other system prompts, no
tools) get a default reply and land in side segments.
"""

from __future__ import annotations

import asyncio
import json
import os

import pytest

from tests.doubles.scripted_vllm import Reply, ScriptedVLLM
from tests.proxy._support import SCAFFOLD_BIN, proxy_server, run_cli, write_hi_call

pytestmark = pytest.mark.scaffold_cli

CLAUDE = SCAFFOLD_BIN / "claude"


def _is_main(prompt: str) -> bool:
    return '"name": "Bash"' in prompt


def _workdir_and_env(tmp_path, base_url: str):
    """Claude Code's working directory (made) and environment, pointed at ``base_url``."""
    work = tmp_path / "work"
    work.mkdir()
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
        "IS_SANDBOX": "1",
        "ANTHROPIC_BASE_URL": base_url,
    }
    env |= {
        "ANTHROPIC_API_KEY": "dummy",
        "DISABLE_TELEMETRY": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }
    return work, env


@pytest.mark.skipif(not CLAUDE.exists(), reason="Claude Code not installed (infra/setup.sh)")
async def test_claude_code_runs_a_tool_through_the_proxy(tok, tmp_path):
    script = [Reply(write_hi_call("Bash")), Reply("I wrote hi to out.txt.")]
    async with ScriptedVLLM(
        tok, script=script, match=_is_main, default=Reply("Greeting"), max_model_len=1_000_000
    ) as dbl:
        async with proxy_server(tok, dbl.url, max_context_tokens=None) as srv:
            h = srv.open_session()
            work, env = _workdir_and_env(tmp_path, h.anthropic_base_url)
            code, out, err = await run_cli(
                [
                    str(CLAUDE),
                    "-p",
                    "Create a file out.txt containing hi.",
                    "--dangerously-skip-permissions",
                    "--output-format",
                    "json",
                ],
                work,
                env,
            )
            assert code == 0, (out[-2000:], err[-2000:])
            result = json.loads(out)
            traj = srv.session(h.session_id).trajectory
    assert (work / "out.txt").read_text().strip() == "hi"
    assert "I wrote hi to out.txt." in result["result"]
    main_turns = [r for r in traj.turns if traj.segments[r.segment].kind == "main"]
    assert len(main_turns) >= 2 and dbl.script == []
    first, second = main_turns[:2]
    # The second main turn extended the first: same segment, prompt starts with its full sequence.
    assert second.segment == first.segment and second.env_tokens_added > 0
    p1, p2 = (r["prompt"] for r in dbl.main_requests[:2])
    seg = traj.segments[first.segment]
    assert seg.full_ids[: len(p2)] == p2 and p2[: len(p1)] == p1
    assert traj.counters.tool_calls >= 1
    sides = [s for s in traj.segments if s.kind == "side"]
    print(
        f"claude code: {len(main_turns)} main turns, {len(sides)} side segments, "
        f"{len(dbl.requests)} backend calls, main prompt {len(p1)} tokens"
    )


@pytest.mark.skipif(not CLAUDE.exists(), reason="Claude Code not installed (infra/setup.sh)")
async def test_claude_code_never_sees_a_replica_outage_the_proxy_holds(tok, tmp_path):
    """The only replica dies right after Claude Code's first main turn (while the Bash tool
    runs) and is back 8 s later: the proxy holds the next requests (streams with ping events
    every 0.2 s meanwhile), Claude Code finishes as if nothing happened (exit 0, its file, its
    answer) and the session counts the holds, no infrastructure error."""
    script = [Reply(write_hi_call("Bash")), Reply("I wrote hi to out.txt.")]
    async with ScriptedVLLM(
        tok, script=script, match=_is_main, default=Reply("Greeting"), max_model_len=1_000_000
    ) as dbl:
        async with proxy_server(tok, dbl.url, max_context_tokens=None, outage_hold_s=120) as srv:
            h = srv.open_session()
            work, env = _workdir_and_env(tmp_path, h.anthropic_base_url)

            async def outage() -> None:
                while dbl.answered < 1 or len(dbl.script) > 1:  # the first main reply went out
                    await asyncio.sleep(0.01)
                port = dbl.port
                await dbl.stop()
                await asyncio.sleep(8)
                await dbl.start(port)

            down = asyncio.create_task(outage())
            argv = [
                str(CLAUDE),
                "-p",
                "Create a file out.txt containing hi.",
                "--dangerously-skip-permissions",
            ]
            code, out, err = await run_cli([*argv, "--output-format", "json"], work, env)
            await down
            traj = srv.session(h.session_id).trajectory
    assert code == 0, (out[-2000:], err[-2000:])
    assert (work / "out.txt").read_text().strip() == "hi"
    assert "I wrote hi to out.txt." in json.loads(out)["result"]
    assert traj.counters.outage_holds >= 1 and traj.counters.infra_errors == 0
    print(f"claude code through an 8 s outage: {traj.counters.outage_holds} requests held")
