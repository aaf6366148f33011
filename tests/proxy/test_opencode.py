"""The real OpenCode CLI (npm, 1.18.x) against the proxy's OpenAI endpoint, on the host.

OpenCode is configured through ``OPENCODE_CONFIG_CONTENT`` with an OpenAI-compatible
provider (``@ai-sdk/openai-compatible``, bundled in its binary) whose ``baseURL`` is the
session's OpenAI base URL. The scripted vLLM double plays the model: on the main
conversation (prompts carrying OpenCode's ``bash`` tool) it calls bash to write a file,
then answers with text; side calls (title generation) get a default reply.
"""

from __future__ import annotations

import json
import os

import pytest

from tests.doubles.scripted_vllm import Reply, ScriptedVLLM
from tests.proxy._support import SCAFFOLD_BIN, proxy_server, run_cli, write_hi_call

pytestmark = pytest.mark.scaffold_cli

OPENCODE = SCAFFOLD_BIN / "opencode"


def opencode_config(openai_base_url: str) -> dict:
    return {
        "$schema": "https://opencode.ai/config.json",
        "provider": {
            "trialflow": {
                "npm": "@ai-sdk/openai-compatible",
                "name": "trialflow proxy",
                "options": {"baseURL": openai_base_url, "apiKey": "dummy"},
                "models": {
                    "policy": {
                        "name": "policy",
                        "tool_call": True,
                        "limit": {"context": 1_000_000, "output": 4096},
                    }
                },
            }
        },
        "model": "trialflow/policy",
        "small_model": "trialflow/policy",
        "permission": {"bash": "allow", "edit": "allow", "external_directory": "allow"},
        "autoupdate": False,
        "share": "disabled",
    }


@pytest.mark.skipif(not OPENCODE.exists(), reason="OpenCode not installed (infra/setup.sh)")
async def test_opencode_runs_a_tool_through_the_proxy(tok, tmp_path):
    script = [Reply(write_hi_call("bash")), Reply("I wrote hi to out.txt.")]
    async with ScriptedVLLM(
        tok,
        script=script,
        match=lambda p: '"name": "bash"' in p,
        default=Reply("Greeting"),
        max_model_len=1_000_000,
    ) as dbl:
        async with proxy_server(tok, dbl.url, max_context_tokens=None) as srv:
            h = srv.open_session()
            work = tmp_path / "work"
            work.mkdir()
            env = {
                "PATH": os.environ["PATH"],
                "HOME": str(tmp_path),
                "OPENCODE_CONFIG_CONTENT": json.dumps(opencode_config(h.openai_base_url)),
                "OPENCODE_DISABLE_AUTOUPDATE": "1",
                "OPENCODE_DISABLE_MODELS_FETCH": "1",
                "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
                "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
            }
            code, out, err = await run_cli(
                [
                    str(OPENCODE),
                    "run",
                    "--format",
                    "json",
                    "-m",
                    "trialflow/policy",
                    "Create a file out.txt containing hi.",
                ],
                work,
                env,
            )
            assert code == 0, (out[-3000:], err[-3000:])
            traj = srv.session(h.session_id).trajectory
    assert (work / "out.txt").read_text().strip() == "hi", (out[-3000:], err[-3000:])
    assert b"I wrote hi to out.txt." in out
    # The agent's conversation: the segment whose first prompt is the first tool-carrying request.
    # (OpenCode sends its title request first; the tracker may record either as "main".)
    p1, p2 = (r["prompt"] for r in dbl.main_requests[:2])
    (agent,) = [i for i, seg in enumerate(traj.segments) if seg.prompt_ids.tolist() == p1]
    turns = [r for r in traj.turns if r.segment == agent]
    assert len(turns) >= 2 and dbl.script == [] and turns[1].env_tokens_added > 0
    assert p2[: len(p1)] == p1 and traj.segments[agent].full_ids[: len(p2)] == p2
    assert traj.counters.tool_calls >= 1
    assert len(traj.segments) == 1 + len(dbl.requests) - len(dbl.main_requests)  # each side call apart
    print(
        f"opencode: {len(turns)} agent turns, {len(traj.segments)} segments "
        f"({[s.kind for s in traj.segments]}), {len(dbl.requests)} backend calls, agent prompt {len(p1)} tokens"
    )
