"""`mini-swe-agent`: the PyPI mini-swe-agent (2.4) loop against the trial's proxy session.

mini-swe-agent (and litellm) live in their own venv, installed once on the host by
`infra/setup.sh` into `<repo>/.cache/mini-swe-agent` (Python >= 3.10; the host's 3.11). Its
agent loop runs on the worker (`runs_in_sandbox = False`: its model client reaches the
proxy's own URL), as `_mini_swe_runner.py` in that venv: mini-swe-agent's `DefaultAgent`,
`LitellmModel` (model ``openai/<model>``, `api_base` = the session's OpenAI URL, Chat
Completions with its ``bash`` tool) and the templates of its ``mini.yaml``. Each command it
issues comes to this scaffold over the runner's stdin/stdout and runs in the sandbox
(`Sandbox.exec`, as the task's agent user, in the task's workdir) — mini-swe-agent's own
rule that every command is a fresh subshell holds there too.

Outcome (exit code of the `ScaffoldResult`, stdout = one JSON line per command and the
runner's final line): 0 the agent submitted (echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT);
1 its step limit (`max_turns` model calls; `stop_reason="max_turns"`); 2 another ending of
the agent (e.g. repeated format errors); 3 an exception in the loop, e.g. the proxy refused
or could not be reached (litellm's message in `detail`); 124 + `timed_out` when the agent
timeout ran out (the runner is killed).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from trialflow.errors import ScaffoldSetupFailed
from trialflow.scaffolds.base import Scaffold, ScaffoldContext, ScaffoldResult

DEFAULT_VENV = Path(__file__).resolve().parents[2] / ".cache" / "mini-swe-agent"
RUNNER = Path(__file__).with_name("_mini_swe_runner.py")
EXIT_TIMEOUT = 124
HEARTBEAT_S = 5.0
RUNNER_ENV = {
    "MSWEA_SILENT_STARTUP": "1",
    "MSWEA_COST_TRACKING": "ignore_errors",
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # no download of litellm's price list
    "LITELLM_TELEMETRY": "False",
}


class MiniSweAgentScaffold(Scaffold):
    """Options: `max_turns` (mini-swe-agent's step limit: model calls), `model_args` (extra
    litellm completion arguments, e.g. temperature), `command_timeout_s` (one command),
    `venv` (the host venv with mini-swe-agent; default `DEFAULT_VENV`)."""

    name = "mini-swe-agent"
    needs_model = True
    supports_max_turns = True
    runs_in_sandbox = False

    def __init__(
        self,
        *,
        max_turns: int = 50,
        model_args: dict[str, Any] | None = None,
        command_timeout_s: int = 120,
        venv: str | Path | None = None,
    ) -> None:
        if max_turns < 1:
            raise ValueError("max_turns must be at least 1")
        self.max_turns = max_turns
        self.model_args = dict(model_args or {})
        self.command_timeout_s = command_timeout_s
        self.venv = Path(venv) if venv else DEFAULT_VENV

    @property
    def python(self) -> Path:
        python = self.venv / "bin" / "python"
        if not python.is_file():
            raise ScaffoldSetupFailed(f"mini-swe-agent venv not found ({python}); run infra/setup.sh")
        return python

    async def run(self, ctx: ScaffoldContext) -> ScaffoldResult:
        if not ctx.openai_base_url or not ctx.model:
            raise ScaffoldSetupFailed("mini-swe-agent needs the proxy session's openai_base_url and a model")
        python = self.python
        started = time.monotonic()
        config = {
            "instruction": ctx.instruction or "",
            "model": ctx.model,
            "base_url": ctx.openai_base_url,
            "model_args": self.model_args,
            "max_turns": self.max_turns,
            "command_timeout_s": self.command_timeout_s,
            "template_vars": await self._uname(ctx),
        }
        home = tempfile.TemporaryDirectory(prefix="tf-mini-swe-")
        env = {"PATH": "/usr/bin:/bin", "HOME": home.name, "MSWEA_GLOBAL_CONFIG_DIR": home.name, **RUNNER_ENV}
        proc = await asyncio.create_subprocess_exec(
            str(python),
            str(RUNNER),
            json.dumps(config),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
            limit=16 * 1024**2,
        )
        log: list[str] = []
        stderr_task = asyncio.ensure_future(proc.stderr.read())  # type: ignore[union-attr]
        done: dict[str, Any] = {}
        try:
            await asyncio.wait_for(self._serve(ctx, proc, log, done), ctx.timeout_s)
            code = await proc.wait()
            timed_out = False
        except TimeoutError:
            timed_out, code = True, EXIT_TIMEOUT
        finally:
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
            home.cleanup()
        stderr = (await stderr_task).decode(errors="replace")
        if timed_out:
            stderr += "\nagent timeout"
        detail = done.get("error") or None
        return ScaffoldResult(
            code,
            timed_out,
            "\n".join(log),
            stderr[-20_000:],
            time.monotonic() - started,
            stop_reason="max_turns"
            if not timed_out and done.get("exit_status") == "LimitsExceeded"
            else None,
            detail=f"{done.get('exit_status')}: {detail}" if detail else None,
        )

    async def _serve(self, ctx: ScaffoldContext, proc: Any, log: list[str], done: dict[str, Any]) -> None:
        """Answer the runner's commands until it reports the end (or closes stdout)."""
        commands = 0
        ctx.heartbeat({"scaffold": self.name, "commands": 0})
        while True:
            # while the model thinks, beat every HEARTBEAT_S (readline itself may wait long)
            read = asyncio.ensure_future(proc.stdout.readline())
            while not (await asyncio.wait({read}, timeout=HEARTBEAT_S))[0]:
                ctx.heartbeat({"scaffold": self.name, "commands": commands, "waiting": "model"})
            line = read.result()
            if not line:
                return
            message = json.loads(line)
            if message.get("op") == "done":
                done.update(message)
                log.append(json.dumps(message))
                return
            commands += 1
            ctx.heartbeat({"scaffold": self.name, "commands": commands})
            output = await self._exec(ctx, str(message.get("command", "")), int(message.get("timeout") or 0))
            log.append(json.dumps({"command": message.get("command"), "returncode": output["returncode"]}))
            proc.stdin.write((json.dumps(output) + "\n").encode())
            await proc.stdin.drain()

    async def _exec(self, ctx: ScaffoldContext, command: str, timeout_s: int) -> dict[str, Any]:
        res = await ctx.sandbox.exec(
            command, timeout_s=timeout_s or self.command_timeout_s, user=ctx.task.config.agent.user
        )
        info = f"The command timed out after {timeout_s} seconds." if res.timed_out else ""
        # mini-swe-agent's local environment merges stderr into stdout
        return {"output": res.stdout + res.stderr, "returncode": res.exit_code, "exception_info": info}

    async def _uname(self, ctx: ScaffoldContext) -> dict[str, str]:
        """The sandbox's uname, for mini.yaml's <system_information> (system release version machine)."""
        res = await ctx.sandbox.exec(["uname", "-s", "-r", "-v", "-m"], timeout_s=30)
        parts = res.stdout.split() if res.ok else []
        if len(parts) < 4:
            return {"system": "Linux", "release": "", "version": "", "machine": ""}
        return {
            "system": parts[0],
            "release": parts[1],
            "version": " ".join(parts[2:-1]),
            "machine": parts[-1],
        }
