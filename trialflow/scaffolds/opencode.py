"""`opencode`: the OpenCode CLI, pointed at the trial's proxy session (OpenAI protocol).

The host-installed native binary (npm `opencode-ai` 1.18.x, platform package
`opencode-linux-x64/bin/opencode`) is bind-mounted read-only at `/opt/trialflow/bin/opencode`
and run in the task's workdir as the task's agent user::

    opencode run --pure --format json -- <instruction>

Configuration goes in through `OPENCODE_CONFIG_CONTENT` (nothing is written into the task's
workdir): one custom provider `trialflow` using the `@ai-sdk/openai-compatible` provider,
whose `baseURL` is the session's OpenAI URL. OpenCode 1.18 bundles that provider package in
its binary, so nothing is downloaded at run time for it. It still asks the npm registry for
plugin metadata on start (`@opencode-ai/plugin`; `--pure` and
`OPENCODE_DISABLE_DEFAULT_PLUGINS` do not stop the lookup); without network that lookup
fails and the run goes on. `small_model` is the same model, so the title request that
OpenCode sends first also goes to the proxy (and is recorded as a turn).

Outcome: the CLI's exit code as is (1 on an API error, which also appears as a `{"type":
"error"}` event on stdout); stdout = the JSON events; `summarize_events` folds them.

Turn limit: OpenCode's own, an agent's `steps` (alias `maxSteps`), is no limit: from that
step on, 1.18.33 appends an assistant message asking for a text-only answer to each request
but still offers and runs the tools, so a model that keeps calling them goes on. `max_turns`
is therefore the proxy session's (`session_max_turns`): past it the session answers the next
request with a 400 `turn_limit_reached` (not retryable for the AI SDK, and worded so that
OpenCode does not take it for a context overflow and compact), OpenCode reports the API
error and exits 1, and the scaffold activity ends the trial as "max_turns".
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from trialflow.errors import ScaffoldSetupFailed
from trialflow.scaffolds._cli import MOUNT_DIR, CliRun, CliScaffold, json_events, object_field, skills_setup
from trialflow.scaffolds.base import ScaffoldContext, positive_or_none

BINARY_CANDIDATES = (
    "opencode-linux-x64/bin/opencode",
    "opencode-linux-x64-baseline/bin/opencode",  # for CPUs without AVX2
    "opencode-ai/bin/opencode.exe",
)
IN_SANDBOX = f"{MOUNT_DIR}/opencode"
HOME = "/tmp/trialflow-opencode-home"
SKILLS_DIR = f"{HOME}/.config/opencode/skills"  # where Harbor's opencode agent copies skills_dir
PROVIDER_ID = "trialflow"


@dataclass(frozen=True)
class EventSummary:
    """Fold of `opencode run --format json` output. `errors` holds each error event's
    message; `last_finish_reason` is the reason of the last finished step (None: none)."""

    events: int
    steps: int
    tool_uses: int
    errors: tuple[str, ...]
    last_finish_reason: str | None
    bad_lines: int


def summarize_events(stdout: str) -> EventSummary:
    parsed, bad = json_events(stdout)
    steps = tools = 0
    errors: list[str] = []
    reason = None
    for event in parsed:
        kind = event.get("type")
        part = object_field(event, "part")
        if kind == "step_finish":
            steps += 1
            reason = part.get("reason")
        elif kind == "tool_use":
            tools += 1
        elif kind == "error":
            err = event.get("error") or {}
            data = err.get("data") if isinstance(err, dict) else None
            message = data.get("message") if isinstance(data, dict) else None
            errors.append(str(message or err))
    return EventSummary(len(parsed), steps, tools, tuple(errors), reason, bad)


def opencode_config(
    base_url: str,
    model: str,
    *,
    context_limit: int | None = None,
    output_limit: int | None = None,
    model_args: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The `opencode.json` content for one session. Limits None: OpenCode's defaults
    (it then asks for 32000 output tokens per request). `model_args` become the model
    entry's `options`, which OpenCode 1.18 adds to every request body (`reasoningEffort` as
    `reasoning_effort`, other keys verbatim)."""
    model_cfg: dict[str, Any] = {"name": model, "tool_call": True}
    if context_limit is not None or output_limit is not None:
        model_cfg["limit"] = {"context": context_limit or 0, "output": output_limit or 0}
    if model_args:
        model_cfg["options"] = dict(model_args)
    return {
        "$schema": "https://opencode.ai/config.json",
        "provider": {
            PROVIDER_ID: {
                "npm": "@ai-sdk/openai-compatible",
                "name": "trialflow proxy",
                "options": {"baseURL": base_url, "apiKey": "trialflow"},
                "models": {model: model_cfg},
            }
        },
        "model": f"{PROVIDER_ID}/{model}",
        "small_model": f"{PROVIDER_ID}/{model}",
        "autoupdate": False,
        "share": "disabled",
        "permission": {"*": "allow"},  # no one answers prompts in a sandbox
    }


def opencode_env(config: dict[str, Any]) -> dict[str, str]:
    return {
        "OPENCODE_CONFIG_CONTENT": json.dumps(config),
        "OPENCODE_DISABLE_MODELS_FETCH": "1",
        "OPENCODE_DISABLE_AUTOUPDATE": "1",
        "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
        "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
        "OPENCODE_DISABLE_SHARE": "1",
        "HOME": HOME,
    }


class OpenCodeScaffold(CliScaffold):
    """Options: `max_turns` (model calls the proxy session serves, its title call not
    counted; None: no limit), `context_limit` / `output_limit` (tokens, for the model entry),
    `model_args` (fields added to every model request, e.g. `{"reasoningEffort": "none",
    "max_tokens": 512}`: the proxy reads the thinking switch and bounds the turn by
    `max_tokens`, and notes the fields it does not act on; sampling stays the session's),
    plus `CliScaffold`'s `install_dir` and `extra_args`."""

    name = "opencode"
    needs_model = True
    main_thread = "first_with_tools"  # its first call may be a tool-less title/quota call
    supports_max_turns = True
    reads_skills = True  # `skills_setup` into SKILLS_DIR, as Harbor's opencode agent
    binary = "opencode"
    candidates = BINARY_CANDIDATES

    def __init__(
        self,
        *,
        max_turns: int | None = None,
        context_limit: int | None = None,
        output_limit: int | None = None,
        model_args: Mapping[str, Any] | None = None,
        **options: Any,
    ) -> None:
        super().__init__(**options)
        self.max_turns = positive_or_none(max_turns, "max_turns")
        self.context_limit = context_limit
        self.output_limit = output_limit
        self.model_args = dict(model_args or {})

    def session_max_turns(self) -> int | None:
        return self.max_turns

    def command(self, ctx: ScaffoldContext) -> CliRun:
        if not ctx.openai_base_url or not ctx.model:
            raise ScaffoldSetupFailed("opencode needs the proxy session's openai_base_url and a model")
        config = opencode_config(
            ctx.openai_base_url,
            ctx.model,
            context_limit=self.context_limit,
            output_limit=self.output_limit,
            model_args=self.model_args,
        )
        return CliRun(
            name=self.name,
            # After `--`, an instruction starting with "-" is still the message.
            argv=[
                IN_SANDBOX,
                "run",
                "--pure",
                "--format",
                "json",
                *self.extra_args,
                "--",
                ctx.instruction or "",
            ],
            env=opencode_env(config),
            home=HOME,
            setup=skills_setup(ctx.task.config.environment.skills_dir, SKILLS_DIR),
        )

    def summarize(self, stdout: str) -> EventSummary:
        return summarize_events(stdout)
