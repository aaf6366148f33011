"""Fixtures for the model-driven scaffolds.

scripted_proxy   async factory: `await scripted_proxy(script, default=...)` -> (ProxyServer,
                 ScriptedVLLM): the REAL proxy in-process, backed by the ScriptedVLLM test
                 double (vLLM's /v1/completions wire format through the tiny model's
                 tokenizer). Both are stopped at teardown.
cli_binary       skips the test unless the host npm install of that CLI exists
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator

import pytest

from trialflow.errors import ScaffoldSetupFailed

# Large enough for Claude Code's system prompt + tools through the tiny BPE tokenizer.
CONTEXT = 400_000


async def forwarded_urls(proxy, handle, sandbox) -> tuple[str, str]:
    """(Anthropic, OpenAI) base URLs of `handle`'s session as a CLI in `sandbox` reaches it:
    served inside the sandbox's network namespace (its only endpoint), as the scaffold
    activity does it."""
    base = await proxy.serve_session(handle.session_id, await sandbox.listen_loopback())
    return base, f"{base}/v1"


def hermes_call(name: str, arguments: dict) -> str:
    """A tool call as the tiny model's (hermes) format writes it."""
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


@pytest.fixture
async def scripted_proxy(tiny_model_dir) -> AsyncIterator:
    from transformers import AutoTokenizer

    from proxy.server import ProxyServer
    from proxy.session import SessionConfig
    from tests.doubles.scripted_vllm import Reply, ScriptedVLLM

    started: list = []

    async def make(script: list, default=None):
        default = default if default is not None else Reply("Done.")
        tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
        vllm = await ScriptedVLLM(
            tokenizer=tok, script=list(script), default=default, model="tiny", max_model_len=CONTEXT
        ).start()
        started.append(vllm)
        proxy = ProxyServer(
            model_dir=tiny_model_dir,
            replicas=[vllm.url],
            defaults=SessionConfig(model="tiny", max_context_tokens=CONTEXT),
        )
        await proxy.start()
        started.append(proxy)
        return proxy, vllm

    yield make
    for server in reversed(started):
        await server.stop()


def require_cli(scaffold) -> None:
    """Skip when the host has no npm install of this scaffold's CLI (infra/setup.sh); under
    ``CI=true`` that is a failure (CI installs everything)."""
    try:
        scaffold.mounts()
    except ScaffoldSetupFailed as err:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true and a required scaffold is missing: {err}")
        pytest.skip(str(err))
