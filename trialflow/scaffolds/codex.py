"""`codex`: OpenAI's Codex CLI, pointed at the trial's proxy session (OpenAI Responses API).

The host install (npm `@openai/codex` 0.169, platform package `@openai/codex-linux-x64`) is
a static musl binary plus helpers in one vendor directory
(`vendor/x86_64-unknown-linux-musl/{bin/codex, codex-path/rg, codex-resources/}`); the whole
directory is bind-mounted read-only at `/opt/trialflow/codex` and the agent runs in the task's
workdir as the task's agent user::

    codex exec --json --skip-git-repo-check --ephemeral
               --dangerously-bypass-approvals-and-sandbox
               -c model=<model> -c model_provider=trialflow
               -c 'model_providers.trialflow={base_url=<openai url>, wire_api="responses", ...}'
               [-c model_context_window=N] -- <instruction>

Everything is configured with `-c` overrides (nothing written into the task's workdir, no
login): a custom model provider whose `base_url` is the session's OpenAI URL, key from
`TRIALFLOW_CODEX_KEY` (a dummy), `wire_api = "responses"`, no client retries
(`request_max_retries`/`stream_max_retries` 0: a failed turn is the proxy's to report, and a
retry would record the same turn twice) and a long `stream_idle_timeout_ms` (the proxy's
keep-alives are SSE comments, which Codex's idle timer does not count). Codex's own sandbox
is off: the trial's container is the sandbox (Codex's bubblewrap sandbox needs namespaces a
container does not give). `CODEX_HOME` is a fresh writable directory outside /tmp (Codex
refuses to put its `apply_patch` helper on PATH from a temporary directory).

Outcome: the CLI's exit code as is (0 after `turn.completed`, 1 on `turn.failed`); stdout =
the `--json` JSONL events, folded by `summarize_events`. A proxy that cannot be reached makes
Codex reconnect until the agent timeout.

Turn limit: Codex 0.169 has none of its own (no `exec` flag or config key bounds the model
calls of a turn; openai/codex#33294 asks for one), so `max_turns` is the proxy session's
(`session_max_turns`): past it the session answers the next request with a 400
`turn_limit_reached`, which Codex does not retry (its retries are off, above) and reports as
`turn.failed`, exit 1; the scaffold activity ends the trial as "max_turns".
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trialflow.errors import ScaffoldSetupFailed
from trialflow.sandbox.base import Mount
from trialflow.scaffolds._cli import CliRun, CliScaffold, json_events, object_field, skills_setup
from trialflow.scaffolds.base import ScaffoldContext, positive_or_none

VENDOR_CANDIDATES = (
    "@openai/codex-linux-x64/vendor/x86_64-unknown-linux-musl",
    "@openai/codex/vendor/x86_64-unknown-linux-musl",  # older layouts kept the vendor dir here
)
MOUNT_AT = "/opt/trialflow/codex"
IN_SANDBOX = f"{MOUNT_AT}/bin/codex"
HOME = "/opt/trialflow-codex-home"
SKILLS_DIR = f"{HOME}/.agents/skills"  # where Harbor's codex agent copies a task's skills_dir
PROVIDER_ID = "trialflow"
KEY_ENV = "TRIALFLOW_CODEX_KEY"


@dataclass(frozen=True)
class EventSummary:
    """Fold of `codex exec --json` output. `last_message` is the last `agent_message` text;
    `errors` the messages of `error` events and of a `turn.failed`; `failed` whether the turn
    ended with `turn.failed`; `completed` whether it ended with `turn.completed`."""

    events: int
    commands: int
    file_changes: int
    last_message: str | None
    errors: tuple[str, ...]
    completed: bool
    failed: bool
    bad_lines: int


def summarize_events(stdout: str) -> EventSummary:
    parsed, bad = json_events(stdout)
    commands = changes = 0
    last = None
    errors: list[str] = []
    completed = failed = False
    for event in parsed:
        kind = event.get("type")
        item = object_field(event, "item")
        if kind == "item.completed":
            if item.get("type") == "command_execution":
                commands += 1
            elif item.get("type") == "file_change":
                changes += 1
            elif item.get("type") == "agent_message":
                last = item.get("text")
        elif kind == "error":
            errors.append(str(event.get("message")))
        elif kind == "turn.failed":
            failed = True
            err = event.get("error")
            errors.append(str(err.get("message") if isinstance(err, dict) else err))
        elif kind == "turn.completed":
            completed = True
    return EventSummary(len(parsed), commands, changes, last, tuple(errors), completed, failed, bad)


# Config keys that route the model calls to the session: `config` may not change them.
ROUTING_KEYS = ("model", "model_provider", "model_providers")


def toml_value(value: Any) -> str:
    """`value` as a TOML value for a `-c key=value` override: strings, numbers, booleans,
    lists and (inline) tables of them; `ValueError` for anything else."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(str(k))} = {toml_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, (str, bool, int, float)):  # JSON's forms of these are valid TOML
        return json.dumps(value)
    raise ValueError(f"cannot write {value!r} as a TOML value")


def check_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The `config` option checked: TOML-writable values, no routing key (`ValueError`)."""
    for key, value in config.items():
        if key.split(".")[0] in ROUTING_KEYS:
            raise ValueError(f"config key {key!r} would re-route the model calls away from the session")
        toml_value(value)
    return dict(config)


def codex_argv(
    instruction: str,
    base_url: str,
    model: str,
    *,
    context_window: int | None = None,
    config: Mapping[str, Any] | None = None,
    extra_args: Sequence[str] = (),
) -> list[str]:
    provider = {
        "name": "trialflow proxy",
        "base_url": base_url,
        "wire_api": "responses",
        "env_key": KEY_ENV,
        "request_max_retries": 0,
        "stream_max_retries": 0,
        "stream_idle_timeout_ms": 24 * 3600 * 1000,
    }
    argv = [
        IN_SANDBOX,
        "exec",
        "--json",
        "--skip-git-repo-check",
        "--ephemeral",
        "--dangerously-bypass-approvals-and-sandbox",
        "-c",
        f"model={json.dumps(model)}",
        "-c",
        f"model_provider={json.dumps(PROVIDER_ID)}",
        "-c",
        f"model_providers.{PROVIDER_ID}={toml_value(provider)}",
    ]
    if context_window is not None:
        argv += ["-c", f"model_context_window={int(context_window)}"]
    for key, value in (config or {}).items():
        argv += ["-c", f"{key}={toml_value(value)}"]
    # After `--`, an instruction starting with "-" is still the prompt.
    return [*argv, *extra_args, "--", instruction]


class CodexScaffold(CliScaffold):
    """Options: `max_turns` (model calls the proxy session serves; None: no limit),
    `context_window` (tokens; None: Codex's fallback for an unknown model), `config` (Codex
    config keys set with `-c`, its model arguments among them, e.g.
    `{"model_reasoning_effort": "none"}`: the request's `reasoning.effort`, which the proxy
    reads as the thinking switch; not the keys that route calls to the session), plus
    `CliScaffold`'s `install_dir` and `extra_args`."""

    name = "codex"
    needs_model = True
    supports_max_turns = True
    reads_skills = True  # `skills_setup` into SKILLS_DIR, as Harbor's codex agent
    binary = "codex"
    candidates = VENDOR_CANDIDATES

    def __init__(
        self,
        *,
        max_turns: int | None = None,
        context_window: int | None = None,
        config: Mapping[str, Any] | None = None,
        **options: Any,
    ) -> None:
        super().__init__(**options)
        self.max_turns = positive_or_none(max_turns, "max_turns")
        self.context_window = context_window
        self.config = check_config(config or {})

    def session_max_turns(self) -> int | None:
        return self.max_turns

    @property
    def in_sandbox(self) -> str:
        return IN_SANDBOX

    def vendor_dir(self) -> Path:
        for rel in self.candidates:
            path = self.install_dir / rel
            if (path / "bin" / "codex").is_file():
                return path.resolve()
        tried = ", ".join(str(self.install_dir / rel / "bin" / "codex") for rel in self.candidates)
        raise ScaffoldSetupFailed(f"codex binary not found (tried {tried}); run infra/setup.sh")

    def mounts(self) -> Sequence[Mount]:
        return (Mount(source=str(self.vendor_dir()), target=MOUNT_AT, read_only=True),)

    def command(self, ctx: ScaffoldContext) -> CliRun:
        if not ctx.openai_base_url or not ctx.model:
            raise ScaffoldSetupFailed("codex needs the proxy session's openai_base_url and a model")
        argv = codex_argv(
            ctx.instruction or "",
            ctx.openai_base_url,
            ctx.model,
            context_window=self.context_window,
            config=self.config,
            extra_args=self.extra_args,
        )
        env = {KEY_ENV: "trialflow", "CODEX_HOME": HOME, "HOME": HOME, "NO_COLOR": "1"}
        skills = skills_setup(ctx.task.config.environment.skills_dir, SKILLS_DIR)
        return CliRun(name=self.name, argv=argv, env=env, home=HOME, setup=skills)

    def summarize(self, stdout: str) -> EventSummary:
        return summarize_events(stdout)

    def detail(self, summary: Any) -> str | None:
        return "; ".join(summary.errors[-3:]) if summary.failed and summary.errors else None
