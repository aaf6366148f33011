"""Shared helpers for the proxy I/O tests (tokenizer of the tiny model, pools over doubles)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from transformers import AutoTokenizer

from proxy.backend import VLLMClient
from proxy.pool import ReplicaPool

BASH_TOOL_CALL = '<tool_call>\n{"name": "Bash", "arguments": {"command": "ls"}}\n</tool_call>'
ANTHROPIC_TOOLS = [
    {
        "name": "Bash",
        "description": "Run a shell command",
        "input_schema": {
            "type": "object",
            "properties": {"command": {"type": "string"}},
            "required": ["command"],
        },
    }
]
OPENAI_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "Bash",
            "description": "Run a shell command",
            "parameters": ANTHROPIC_TOOLS[0]["input_schema"],
        },
    }
]


HOLE = "@@DEEP@@"  # where body_with puts a deeply nested value


def nested(depth: int) -> str:
    """JSON text of a value nested ``depth`` levels (objects and lists alternating), built as
    text: the stdlib encoder itself would overflow the stack on it."""
    text = '"x"'
    for i in range(depth):
        text = f"[{text}]" if i % 2 else f'{{"a":{text}}}'
    return text


def body_with(template: dict, depth: int) -> bytes:
    """``template`` as JSON with HOLE (a string value) replaced by a ``depth``-deep value, and
    HOLE inside a JSON-string value (tool-call arguments) by the same value as text."""
    raw = json.dumps(template)
    deep = nested(depth)
    raw = raw.replace(json.dumps(HOLE), deep)
    return raw.replace(HOLE, json.dumps(deep)[1:-1]).encode()


SCAFFOLD_BIN = Path(__file__).resolve().parents[2] / ".cache" / "scaffolds" / "node_modules" / ".bin"


def write_hi_call(tool: str) -> str:
    """The scripted model's call of a scaffold's shell tool ``tool`` that writes out.txt."""
    return (
        f'<tool_call>\n{{"name": "{tool}", "arguments": {{"command": "echo hi > out.txt", '
        '"description": "Write hi to out.txt"}}\n</tool_call>'
    )


async def run_cli(
    argv: list[str], cwd: Path, env: dict[str, str], timeout_s: float = 240
) -> tuple[int, bytes, bytes]:
    """(exit code, stdout, stderr) of a scaffold CLI; killed after ``timeout_s``."""
    proc = await asyncio.create_subprocess_exec(
        *argv, cwd=cwd, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout=timeout_s)
    except TimeoutError:
        proc.kill()
        raise
    assert proc.returncode is not None
    return proc.returncode, out, err


ANTHROPIC_AGENT_KWARGS = dict(
    model="claude-test",
    max_tokens=200,
    system="You are a coding agent.",
    tools=ANTHROPIC_TOOLS,
    thinking={"type": "enabled", "budget_tokens": 100},
)


async def ask_anthropic(client, messages, *, stream: bool, **kwargs):
    """The final ``Message`` of one request, streamed (the SDK's accumulator) or not."""
    if not stream:
        return await client.messages.create(messages=messages, **kwargs)
    async with client.messages.stream(messages=messages, **kwargs) as s:
        return await s.get_final_message()


def load_tokenizer(model_dir: Path):
    return AutoTokenizer.from_pretrained(str(model_dir))


def pool_over(*urls: str, outage_hold_s: float = 0.0) -> ReplicaPool:
    """A pool without background health polling and with short client timeouts; a turn no
    replica can serve fails at once unless ``outage_hold_s`` (the pool's hold) is given."""
    return ReplicaPool(
        urls,
        client_factory=lambda u: VLLMClient(u, timeout_s=10),
        health_interval_s=None,
        outage_hold_s=outage_hold_s,
    )


def proxy_server(
    tok,
    *urls: str,
    keepalive_s: float = 0.2,
    max_body_bytes: int | None = None,
    outage_hold_s: float = 0.0,
    **config,
):
    """A ProxyServer over ``urls`` with test defaults (use as ``async with``); the server's
    own body limit unless ``max_body_bytes``; no outage hold unless ``outage_hold_s``."""
    from proxy.server import DEFAULT_MAX_BODY_BYTES, ProxyServer
    from proxy.session import SessionConfig

    config.setdefault("model", "scripted")
    config.setdefault("max_context_tokens", 4096)
    return ProxyServer(
        tokenizer=tok,
        pool=pool_over(*urls, outage_hold_s=outage_hold_s),
        defaults=SessionConfig(**config),
        keepalive_s=keepalive_s,
        max_body_bytes=DEFAULT_MAX_BODY_BYTES if max_body_bytes is None else max_body_bytes,
    )


def token_view(trajectory) -> list:
    """Every segment's kind and token arrays as lists (experts too): two trajectories are
    token-for-token equal when their views are."""
    return [
        (
            s.kind,
            s.prompt_ids.tolist(),
            s.response_ids.tolist(),
            s.response_mask.tolist(),
            s.response_logprobs.tolist(),
            None if s.routed_experts is None else s.routed_experts.tolist(),
        )
        for s in trajectory.segments
    ]
