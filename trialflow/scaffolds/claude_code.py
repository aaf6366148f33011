"""`claude-code`: Anthropic's Claude Code CLI, pointed at the trial's proxy session.

The host-installed native binary (npm `@anthropic-ai/claude-code` 2.1.x, platform package
`@anthropic-ai/claude-code-linux-x64/claude`) is bind-mounted read-only at
`/opt/trialflow/bin/claude` and run in the task's workdir as the task's agent user::

    claude -p --dangerously-skip-permissions --output-format stream-json --verbose
           --model <model> [--max-turns N] -- <instruction>

with `ANTHROPIC_BASE_URL` = the session's Anthropic URL, a dummy `ANTHROPIC_API_KEY`,
telemetry/nonessential traffic/autoupdate off, `IS_SANDBOX=1` (Claude Code refuses
`--dangerously-skip-permissions` as root otherwise) and a fresh writable `HOME` (it writes
`~/.claude.json` and `~/.claude/`; no onboarding flags are needed in print mode). A task's
`[environment] skills_dir` is copied into `~/.claude/skills/` first (`_cli.skills_setup`), where
Claude Code reads user-level skills, as Harbor's claude-code agent copies it into its config
directory's `skills/`. A task's `[[environment.mcp_servers]]` are written to `~/.claude.json`
as user-scoped servers (`mcp_setup`: loaded without a trust prompt), as Harbor's agent writes
them: `stdio` -> {type, command, args}, `streamable-http` -> type `http`, `sse` -> `sse`, with
the URL (a server with headers is refused at load); a compose task's servers are reached by service name on the sandbox's
loopback (trialflow.sandbox.pod).

Outcome: the CLI's exit code as is (0 = a `result` event with subtype "success"; 1 for
`error_max_turns` / `error_during_execution`; `error_max_turns` sets
`ScaffoldResult.stop_reason` = "max_turns", an outcome rather than a crash), stdout = the stream-json events, and
`summarize_stream` reads the final `result` event. An unreachable proxy makes the CLI retry
with backoff (`CLAUDE_CODE_MAX_RETRIES`, default here 2), so a dead proxy ends the run with
an API error instead of hanging until the agent timeout.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from trialflow.errors import ScaffoldSetupFailed
from trialflow.scaffolds._cli import MOUNT_DIR, CliRun, CliScaffold, json_events, skills_setup
from trialflow.scaffolds.base import ScaffoldContext, StopReason
from trialflow.task_config import MCPServerConfig

BINARY_CANDIDATES = (
    "@anthropic-ai/claude-code-linux-x64/claude",
    "@anthropic-ai/claude-code-linux-x64-musl/claude",
    "@anthropic-ai/claude-code/bin/claude.exe",  # the postinstall hard link to the same binary
)
IN_SANDBOX = f"{MOUNT_DIR}/claude"
HOME = "/tmp/trialflow-claude-home"
# Claude Code's user-level skills (`~/.claude/skills/<name>/SKILL.md`; CLAUDE_CONFIG_DIR unset).
SKILLS_DIR = f"{HOME}/.claude/skills"


def mcp_setup(servers: Sequence[MCPServerConfig]) -> str:
    """Shell that writes the task's MCP servers into `~/.claude.json` ("" without any)."""
    if not servers:
        return ""
    entries: dict[str, dict[str, Any]] = {}
    for s in servers:
        if s.transport == "stdio":
            entries[s.name] = {"type": "stdio", "command": s.command, "args": list(s.args)}
        else:
            # (headers are refused at load, trialflow.tasks: Harbor's credential rules are not repeated)
            entries[s.name] = {
                "type": "http" if s.transport == "streamable-http" else s.transport,
                "url": s.url,
            }
    config = json.dumps({"mcpServers": entries}, indent=2)
    return f"mkdir -p {HOME} && printf '%s\\n' {shlex.quote(config)} > {HOME}/.claude.json"


@dataclass(frozen=True)
class StreamSummary:
    """What a stream-json run ended with. `result_subtype` None: no `result` event (the
    CLI crashed or was killed). `bad_lines` counts non-JSON stdout lines."""

    events: int
    assistant_messages: int
    tool_uses: int
    result_subtype: str | None
    is_error: bool | None
    num_turns: int | None
    result_text: str | None
    bad_lines: int


def summarize_stream(stdout: str) -> StreamSummary:
    """Fold the stream-json lines of one `claude -p` run (pure; tolerant of junk lines)."""
    parsed, bad = json_events(stdout)
    assistant = tools = 0
    result: dict | None = None
    for event in parsed:
        if event.get("type") == "assistant":
            assistant += 1
            content = (event.get("message") or {}).get("content") or []
            tools += sum(
                1 for block in content if isinstance(block, dict) and block.get("type") == "tool_use"
            )
        elif event.get("type") == "result":
            result = event
    return StreamSummary(
        events=len(parsed),
        assistant_messages=assistant,
        tool_uses=tools,
        result_subtype=result.get("subtype") if result else None,
        is_error=result.get("is_error") if result else None,
        num_turns=result.get("num_turns") if result else None,
        result_text=result.get("result") if result else None,
        bad_lines=bad,
    )


def stop_reason_of(summary: StreamSummary) -> StopReason | None:
    """ "max_turns" when the run's `result` event says `--max-turns` stopped it (subtype
    `error_max_turns`; the CLI then exits 1); None for every other ending, including a
    missing `result` event."""
    return "max_turns" if summary.result_subtype == "error_max_turns" else None


def claude_argv(
    instruction: str, model: str, max_turns: int | None, extra_args: Sequence[str] = ()
) -> list[str]:
    argv = [
        IN_SANDBOX,
        "-p",
        "--dangerously-skip-permissions",
        "--output-format",
        "stream-json",
        "--verbose",
        "--model",
        model,
    ]
    if max_turns is not None:
        argv += ["--max-turns", str(max_turns)]
    # After `--`, an instruction starting with "-" is still the prompt.
    return [*argv, *extra_args, "--", instruction]


def claude_env(base_url: str, model: str, *, max_retries: int, api_timeout_s: float | None) -> dict[str, str]:
    env = {
        "ANTHROPIC_BASE_URL": base_url,
        "ANTHROPIC_API_KEY": "trialflow",  # the proxy authenticates by the secret in the URL
        # Background/side requests (titles, summaries) use the same served model.
        "ANTHROPIC_SMALL_FAST_MODEL": model,
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": model,
        "IS_SANDBOX": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "CLAUDE_CODE_MAX_RETRIES": str(max_retries),
        "HOME": HOME,
    }
    if api_timeout_s is not None:
        # A CPU-served turn can take minutes; never let the client give up before the agent timeout.
        env["API_TIMEOUT_MS"] = str(int(api_timeout_s * 1000))
    return env


class ClaudeCodeScaffold(CliScaffold):
    """Options: `max_turns` (None: the CLI's own default, unbounded), `max_retries` (client
    retries per request), plus `CliScaffold`'s `install_dir` and `extra_args`."""

    name = "claude-code"
    needs_model = True
    supports_max_turns = True
    main_thread = "first_with_tools"  # its first call may be a tool-less title/quota call
    reads_skills = True  # `skills_setup`: ~/.claude/skills, where Claude Code finds them
    passes_mcp_servers = True  # `mcp_setup`: ~/.claude.json
    binary = "claude"
    candidates = BINARY_CANDIDATES

    def __init__(self, *, max_turns: int | None = None, max_retries: int = 2, **options: Any) -> None:
        super().__init__(**options)
        self.max_turns = max_turns
        self.max_retries = max_retries

    def command(self, ctx: ScaffoldContext) -> CliRun:
        if not ctx.anthropic_base_url or not ctx.model:
            raise ScaffoldSetupFailed("claude-code needs the proxy session's anthropic_base_url and a model")
        return CliRun(
            name=self.name,
            argv=claude_argv(ctx.instruction or "", ctx.model, self.max_turns, self.extra_args),
            env=claude_env(
                ctx.anthropic_base_url, ctx.model, max_retries=self.max_retries, api_timeout_s=ctx.timeout_s
            ),
            home=HOME,
            setup=" && ".join(
                step
                for step in (
                    skills_setup(ctx.task.config.environment.skills_dir, SKILLS_DIR),
                    mcp_setup(ctx.task.config.environment.mcp_servers),
                )
                if step
            ),
        )

    def summarize(self, stdout: str) -> StreamSummary:
        return summarize_stream(stdout)

    def stop_reason(self, summary: StreamSummary) -> StopReason | None:
        return stop_reason_of(summary)

    def detail(self, summary: StreamSummary) -> str | None:
        # e.g. "API Error: Claude's response exceeded the 32000 output token maximum..."
        return summary.result_text if summary.is_error and summary.result_text else None
