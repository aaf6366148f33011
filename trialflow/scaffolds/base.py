"""Scaffold ABC: an agent harness that works on a task inside a sandbox.

Lifecycle, driven by the scaffold activity::

    scaffold = get_scaffold(name)                    # stateless, cheap; one per run is fine
    mounts = scaffold.mounts()                       # host paths the sandbox needs (before create)
    sandbox = await backend.create(task, ..., mounts=mounts); await sandbox.start()
    result = await scaffold.run(ScaffoldContext(...))
    -> verifier runs on the sandbox afterwards, whatever `result` says

Contracts:
- `run()` returns a `ScaffoldResult` for every outcome of the agent itself: a non-zero exit,
  a crash of the CLI, a timeout (`timed_out=True`; the scaffold stops its process by then).
  It raises only typed infrastructure errors (`SandboxLost`, `ScaffoldSetupFailed`, `TaskInvalid`).
- `run()` must finish within about `ctx.timeout_s` (+ a few seconds of cleanup); `None` = no limit.
- `needs_model=False` scaffolds (oracle, nop) get `anthropic_base_url`/`openai_base_url`/`model`
  as None and must not need them.
- `ctx.heartbeat(details)` may be called as often as the scaffold likes (e.g. once per step);
  it must not block. Default: a no-op.
- `ctx.log_dir` (if set) is a host directory the scaffold may fill with extra logs
  (the activity uploads it). Scaffolds never write results to the store themselves.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from trialflow.sandbox.base import Mount, Sandbox
from trialflow.tasks import Task

if TYPE_CHECKING:
    from proxy.tokenization import MainThreadRule
    from trialflow.task_config import MCPServerConfig


def _no_heartbeat(details: dict[str, Any]) -> None:
    return None


@dataclass
class ScaffoldContext:
    """Everything a scaffold run gets. `instruction` defaults to the task's instruction.md."""

    sandbox: Sandbox
    task: Task
    instruction: str | None = None
    anthropic_base_url: str | None = None  # e.g. http://127.0.0.1:PORT/s/{id}/{secret}
    openai_base_url: str | None = None  # the same + /v1
    model: str | None = None
    timeout_s: float | None = None
    heartbeat: Callable[[dict[str, Any]], None] = _no_heartbeat
    log_dir: Path | None = None
    env: dict[str, str] = field(default_factory=dict)  # extra env for the agent process

    def __post_init__(self) -> None:
        if self.instruction is None:
            self.instruction = self.task.instruction


StopReason = Literal["max_turns"]


@dataclass(frozen=True)
class ScaffoldResult:
    """The agent process's outcome. Output is what the scaffold captured (may be truncated).

    `stop_reason` is set by scaffolds that can tell why the agent stopped short of finishing
    on its own: "max_turns" = it hit its configured turn limit (the exit code is then
    non-zero, yet this is an outcome of the agent, not a crash). None: nothing known.
    `detail` is the agent's own account of a failed ending when it gives one (e.g. Claude
    Code's error `result` text); it goes into the trial's error message."""

    exit_code: int
    timed_out: bool
    stdout: str
    stderr: str
    duration_s: float
    stop_reason: StopReason | None = None
    detail: str | None = None

    @property
    def log(self) -> str:
        """stdout and stderr as one text, for storing as the scaffold log."""
        if not self.stderr:
            return self.stdout
        return f"{self.stdout}\n--- stderr ---\n{self.stderr}"


def skills_problem(scaffold: Scaffold, skills_dir: str | None) -> str | None:
    """Why `scaffold` cannot run a task with `skills_dir` (None: it can), as Harbor decides:
    a model-free scaffold (oracle, nop: Harbor's utility agents) ignores skills; any other
    must read them."""
    if skills_dir is None or not scaffold.needs_model or scaffold.reads_skills:
        return None
    return (
        f"[environment].skills_dir = {skills_dir!r}: scaffold {scaffold.name} does not read skills "
        "(claude-code, codex and opencode do)"
    )


def mcp_problem(scaffold: Scaffold, servers: Sequence[MCPServerConfig]) -> str | None:
    """Why `scaffold` cannot run a task with `[[environment.mcp_servers]]` (None: it can), as
    Harbor decides: a model-free scaffold (oracle, nop) ignores them; any other must pass
    them to its agent (`Scaffold.passes_mcp_servers`)."""
    if not servers or not scaffold.needs_model or scaffold.passes_mcp_servers:
        return None
    names = ", ".join(s.name for s in servers)
    return (
        f"[[environment.mcp_servers]] ({names}): scaffold {scaffold.name} does not pass MCP servers "
        "to its agent (claude-code does)"
    )


def positive_or_none(value: int | None, name: str) -> int | None:
    """A scaffold option that is a positive integer or None (`ValueError` otherwise: the
    registry reports it as a bad option before anything is submitted)."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"{name} must be a positive integer or None, got {value!r}")
    return value


class Scaffold(abc.ABC):
    """Base of every scaffold. Subclasses set `name` and `needs_model` as class attributes."""

    name: str
    needs_model: bool = True
    # Which of the scaffold's calls define the proxy session's main thread (proxy.tokenization
    # rule 1): "first", or "first_with_tools" for CLIs that open with tool-less side calls.
    main_thread: MainThreadRule = "first"
    # Where the agent's model client runs. True (CLIs run in the sandbox): the session's base
    # URLs are a forwarder inside the sandbox (http://127.0.0.1:PORT), its only way out.
    # False (an agent loop on the worker host, e.g. terminus): the proxy's own URLs.
    runs_in_sandbox: bool = True
    # Whether it takes a `max_turns` option: enforced by the agent itself (which reports
    # `stop_reason="max_turns"`), or, for agents without a hard limit of their own, by the
    # trial's proxy session (`session_max_turns`).
    supports_max_turns: bool = False
    # Whether it hands a task's `[environment] skills_dir` to the agent (Harbor's
    # `capabilities.skills`: claude-code, codex and opencode copy it where their CLI reads skills).
    reads_skills: bool = False
    # Whether it hands a task's [[environment.mcp_servers]] to its agent (`mcp_problem`).
    passes_mcp_servers: bool = False

    def session_max_turns(self) -> int | None:
        """The turn limit the trial's proxy session enforces (`proxy.session.SessionConfig.
        max_turns`): past it the session refuses the agent's model calls, and the scaffold
        activity ends the trial as "max_turns". None (the default): the session has no limit;
        the agent enforces its own, or it has none."""
        return None

    def mounts(self) -> Sequence[Mount]:
        """Host paths to bind into the sandbox at creation (e.g. a host-installed CLI)."""
        return ()

    @abc.abstractmethod
    async def run(self, ctx: ScaffoldContext) -> ScaffoldResult:
        """Work on `ctx.task` inside `ctx.sandbox`; see the module docstring."""
