"""`openhands`: the OpenHands SDK's agent (PyPI `openhands-sdk` + `openhands-tools` 1.58) in
the sandbox, against the trial's proxy session (OpenAI Chat Completions through litellm).

OpenHands needs Python >= 3.12; task sandboxes are bookworm (3.11) or anything else. So
`infra/setup.sh` builds once per host a Debian trixie root with a venv of the SDK
(`trialflow.sandbox.base_image.ensure_openhands_root`, at `<repo>/.cache/openhands/root`),
and this scaffold bind-mounts that whole root read-only at `/opt/trialflow/openhands` with
`_openhands_runner.py` next to it. Its Python runs there through the root's OWN dynamic
loader, so it uses the root's glibc and libraries, never the sandbox's::

    ROOT/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2 --library-path ROOT/usr/lib/x86_64-linux-gnu
        ROOT/usr/bin/python3.13 -s RUNNER CONFIG_JSON SITE_PACKAGES      (PYTHONHOME=ROOT/usr)

`--library-path` binds only that process: the tools' commands (a bash of the sandbox's own,
OpenHands' subprocess terminal backend) run with the sandbox's loader and libraries, and the
runner drops PYTHONHOME before starting them. The agent runs as the task's agent user, in
the task's workdir, with HOME a fresh directory.

Outcome (the runner's exit code; stdout = one JSON line per conversation event, then
`{"op": "done", ...}`): 0 finished; 1 its iteration limit (`max_turns` =
`max_iteration_per_run`; `stop_reason="max_turns"`); 2 another ending (stuck, error); 3 an
exception in the loop, e.g. the proxy refused (litellm's message in `detail`); 124 +
`timed_out` when the agent timeout ran out.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trialflow.errors import ScaffoldSetupFailed
from trialflow.sandbox.base import Mount
from trialflow.scaffolds._cli import CliRun, CliScaffold, json_events
from trialflow.scaffolds.base import ScaffoldContext, StopReason

DEFAULT_ROOT = Path(__file__).resolve().parents[2] / ".cache" / "openhands" / "root"
RUNNER = Path(__file__).with_name("_openhands_runner.py")
MOUNT_AT = "/opt/trialflow/openhands"
RUNNER_AT = "/opt/trialflow/openhands-runner.py"
LIBDIR = "usr/lib/x86_64-linux-gnu"
LOADER = f"{LIBDIR}/ld-linux-x86-64.so.2"
PYTHON = "usr/bin/python3.13"
SITE_PACKAGES = "opt/openhands/lib/python3.13/site-packages"
HOME = "/tmp/trialflow-openhands-home"
RUNNER_ENV = {
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # no download of litellm's price list
    "LITELLM_TELEMETRY": "False",
    "OPENHANDS_SUPPRESS_BANNER": "1",
    "LOG_LEVEL": "WARNING",
}


@dataclass(frozen=True)
class RunSummary:
    """Fold of the runner's stdout: events seen, the final status and error (if any)."""

    events: int
    actions: int
    status: str | None
    error_code: str | None
    error: str | None
    bad_lines: int


def summarize_events(stdout: str) -> RunSummary:
    parsed, bad = json_events(stdout)
    done: dict[str, Any] = next((e for e in reversed(parsed) if e.get("op") == "done"), {})
    actions = sum(1 for e in parsed if e.get("event") == "ActionEvent")
    return RunSummary(
        len(parsed), actions, done.get("status"), done.get("error_code"), done.get("error"), bad
    )


class OpenHandsScaffold(CliScaffold):
    """Options: `max_turns` (OpenHands' `max_iteration_per_run`: agent steps), `model_args`
    (extra `openhands.sdk.LLM` fields, e.g. temperature), `root` (the host trixie root with
    the SDK venv; default `DEFAULT_ROOT`), `extra_args` (ignored; kept for the CLI options)."""

    name = "openhands"
    binary = "openhands"
    candidates = ()
    supports_max_turns = True

    def __init__(
        self,
        *,
        max_turns: int = 100,
        model_args: dict[str, Any] | None = None,
        root: str | Path | None = None,
        extra_args: Sequence[str] = (),
    ) -> None:
        super().__init__(extra_args=extra_args)
        if max_turns < 1:
            raise ValueError("max_turns must be at least 1")
        self.max_turns = max_turns
        self.model_args = dict(model_args or {})
        self.root = Path(root) if root else DEFAULT_ROOT

    @property
    def in_sandbox(self) -> str:
        return f"{MOUNT_AT}/{PYTHON}"

    def mounts(self) -> Sequence[Mount]:
        for rel in (LOADER, PYTHON, SITE_PACKAGES + "/openhands/sdk"):
            if not (self.root / rel).exists():
                raise ScaffoldSetupFailed(
                    f"OpenHands root incomplete ({self.root / rel} missing); run infra/setup.sh"
                )
        return (
            Mount(source=str(self.root), target=MOUNT_AT, read_only=True),
            Mount(source=str(RUNNER), target=RUNNER_AT, read_only=True),
        )

    def command(self, ctx: ScaffoldContext) -> CliRun:
        if not ctx.openai_base_url or not ctx.model:
            raise ScaffoldSetupFailed("openhands needs the proxy session's openai_base_url and a model")
        config = {
            "instruction": ctx.instruction or "",
            "model": ctx.model,
            "base_url": ctx.openai_base_url,
            "model_args": self.model_args,
            "max_turns": self.max_turns,
        }
        argv = [
            f"{MOUNT_AT}/{LOADER}",
            "--library-path",
            f"{MOUNT_AT}/{LIBDIR}",
            f"{MOUNT_AT}/{PYTHON}",
            "-s",
            RUNNER_AT,
            json.dumps(config),
            f"{MOUNT_AT}/{SITE_PACKAGES}",
        ]
        env = {"PYTHONHOME": f"{MOUNT_AT}/usr", "HOME": HOME, **RUNNER_ENV}
        return CliRun(name="openhands", argv=argv, env=env, home=HOME)

    def summarize(self, stdout: str) -> RunSummary:
        return summarize_events(stdout)

    def stop_reason(self, summary: RunSummary) -> StopReason | None:
        return "max_turns" if summary.error_code == "MaxIterationsReached" else None

    def detail(self, summary: RunSummary) -> str | None:
        if summary.error is None:
            return None
        return f"{summary.error_code}: {summary.error}" if summary.error_code else summary.error
