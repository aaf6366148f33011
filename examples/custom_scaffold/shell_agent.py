"""A custom scaffold selected by import path: a minimal tool-calling agent with one shell tool.

Run it (the module must be importable by the CLI AND by every worker, hence PYTHONPATH)::

    PYTHONPATH=examples/custom_scaffold trialflow run examples/tasks/create-file \\
        --scaffold shell_agent:ShellAgent --scaffold-option max_turns=10 \\
        --scaffold-option 'model_args={"temperature": 0.7}'

or in the settings (``TRIALFLOW_SCAFFOLD=shell_agent:ShellAgent``,
``TRIALFLOW_SCAFFOLD_OPTIONS='{"max_turns": 10}'``) or per trial in
``TrialSpec(scaffold="shell_agent:ShellAgent", scaffold_options={...})``.

What a scaffold must do (trialflow.scaffolds.base): subclass `Scaffold`, set `name`, take its
options as keyword arguments of `__init__` (checked before a batch is submitted), and return
a `ScaffoldResult` from `run` for every ending of the agent itself; never raise for them.
This one talks OpenAI Chat Completions to the trial's proxy session (`ctx.openai_base_url`),
runs each `bash` call in the sandbox and stops when the model answers without a tool call
(exit 0) or after `max_turns` model calls (exit 1, `stop_reason="max_turns"`).
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import openai

from trialflow.scaffolds import Scaffold, ScaffoldContext, ScaffoldResult

BASH = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a bash command in the task's environment; returns its exit code and output.",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string"}},
            "required": ["command"],
        },
    },
}


class ShellAgent(Scaffold):
    """Options: `max_turns` (model calls), `model_args` (extra Chat Completions arguments,
    e.g. temperature), `command_timeout_s` (per bash call)."""

    name = "shell-agent"
    needs_model = True
    supports_max_turns = True
    runs_in_sandbox = False  # the loop runs in the worker and reaches the proxy directly

    def __init__(
        self, *, max_turns: int = 30, model_args: dict[str, Any] | None = None, command_timeout_s: float = 120
    ) -> None:
        if max_turns < 1:
            raise ValueError("max_turns must be at least 1")
        self.max_turns = max_turns
        self.model_args = dict(model_args or {})
        self.command_timeout_s = command_timeout_s

    async def run(self, ctx: ScaffoldContext) -> ScaffoldResult:
        started = time.monotonic()
        try:
            return await asyncio.wait_for(self._loop(ctx, started), ctx.timeout_s)
        except TimeoutError:
            return ScaffoldResult(124, True, "", "agent timeout", time.monotonic() - started)

    async def _loop(self, ctx: ScaffoldContext, started: float) -> ScaffoldResult:
        client = openai.AsyncOpenAI(base_url=ctx.openai_base_url, api_key="trialflow", max_retries=0)
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": "You solve tasks in a Linux shell. Call bash; answer when done."},
            {"role": "user", "content": ctx.instruction or ""},
        ]
        log: list[str] = []
        try:
            for turn in range(1, self.max_turns + 1):
                ctx.heartbeat({"scaffold": self.name, "turn": turn})
                try:
                    reply = await client.chat.completions.create(
                        model=ctx.model or "", messages=messages, tools=[BASH], **self.model_args
                    )
                except openai.APIError as err:
                    return self._result(1, log, f"model call failed: {err}", started)
                msg = reply.choices[0].message
                messages.append(msg.model_dump(exclude_none=True))
                if not msg.tool_calls:
                    log.append(json.dumps({"turn": turn, "answer": msg.content}))
                    return self._result(0, log, "", started)
                for call in msg.tool_calls:
                    output = await self._bash(ctx, call.function.arguments)
                    log.append(json.dumps({"turn": turn, "call": call.function.arguments, "output": output}))
                    messages.append({"role": "tool", "tool_call_id": call.id, "content": output})
            return self._result(1, log, f"turn limit reached ({self.max_turns})", started, max_turns=True)
        finally:
            await client.close()

    async def _bash(self, ctx: ScaffoldContext, arguments: str) -> str:
        try:
            command = json.loads(arguments)["command"]
        except (ValueError, KeyError, TypeError):
            return "error: arguments must be a JSON object with a string `command`"
        res = await ctx.sandbox.exec(
            command, timeout_s=self.command_timeout_s, user=ctx.task.config.agent.user
        )
        return f"exit code {res.exit_code}\n{res.stdout}{res.stderr}"[-10_000:]

    @staticmethod
    def _result(
        code: int, log: list[str], err: str, started: float, max_turns: bool = False
    ) -> ScaffoldResult:
        return ScaffoldResult(
            code,
            False,
            "\n".join(log),
            err,
            time.monotonic() - started,
            stop_reason="max_turns" if max_turns else None,
        )
