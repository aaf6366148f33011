"""Shared plumbing for scaffolds that are host-installed CLIs run inside the sandbox.

The CLIs (Claude Code, OpenCode) are installed once per host by `infra/setup.sh` with npm
into `<repo>/.cache/scaffolds/node_modules`; each npm package brings a self-contained native
linux-x64 binary (no node needed in the sandbox). A scaffold bind-mounts that one file
read-only at `/opt/trialflow/bin/<name>` (`cli_mount`) and runs it there (`run_cli`).

`run_cli` runs the agent command through `Sandbox.exec` under the agent timeout, with its
stdout/stderr redirected to files under `AGENT_LOG_DIR` inside the sandbox, so that:
- a concurrent poll can count output lines and call `ctx.heartbeat` while the agent runs
  (exec itself only returns at the end);
- the logs survive in the sandbox for debugging; they are copied to `ctx.log_dir` when set.
The agent's timeout is an outcome (`ScaffoldResult.timed_out`), never an exception.

`CliScaffold` is the shared skeleton: subclasses say which binary to mount, how to build the
command (`command`) and how to fold its stdout into a summary (`summarize`, written to
`ctx.log_dir/<name>.summary.json`).
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import json
import shlex
import shutil
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from trialflow.errors import SandboxPathNotFound, ScaffoldSetupFailed, TrialflowError
from trialflow.sandbox.base import Mount
from trialflow.scaffolds.base import (
    Scaffold,
    ScaffoldContext,
    ScaffoldResult,
    StopReason,
)

DEFAULT_INSTALL_DIR = Path(__file__).resolve().parents[2] / ".cache" / "scaffolds" / "node_modules"
MOUNT_DIR = "/opt/trialflow/bin"
AGENT_LOG_DIR = "/logs/agent"
HEARTBEAT_POLL_S = 5.0


def json_events(stdout: str) -> tuple[list[dict], int]:
    """The JSON-object lines of a CLI's event stream, and how many non-blank lines were not
    JSON objects (the CLIs interleave stray output; it is counted, never fatal)."""
    events: list[dict] = []
    bad = 0
    for line in stdout.splitlines():
        if not line.strip():
            continue
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            bad += 1
            continue
        if isinstance(event, dict):
            events.append(event)
        else:
            bad += 1
    return events, bad


def object_field(event: dict, key: str) -> dict:
    """``event[key]`` when it is a JSON object, else an empty one (a missing or odd field)."""
    value = event.get(key)
    return value if isinstance(value, dict) else {}


def find_binary(install_dir: Path, candidates: Sequence[str], *, what: str) -> Path:
    """First existing executable file among `install_dir/candidate`.

    Raises `ScaffoldSetupFailed` naming every path tried (the host lacks the install:
    run infra/setup.sh).
    """
    for rel in candidates:
        path = install_dir / rel
        if path.is_file():
            return path.resolve()
    tried = ", ".join(str(install_dir / rel) for rel in candidates)
    raise ScaffoldSetupFailed(f"{what} binary not found (tried {tried}); run infra/setup.sh")


def cli_mount(binary: Path, name: str) -> Mount:
    return Mount(source=str(binary), target=f"{MOUNT_DIR}/{name}", read_only=True)


@dataclass(frozen=True)
class CliRun:
    """One agent command. `argv[0]` is the in-sandbox binary; `home` is created (writable)
    by the agent's own user before the command runs; `setup` (shell, optional) runs right
    before it, as the same user in the same directory (e.g. copying the task's skills)."""

    name: str
    argv: Sequence[str]
    env: Mapping[str, str]
    home: str
    setup: str = ""

    @property
    def stdout_path(self) -> str:
        return f"{AGENT_LOG_DIR}/{self.name}.stdout.txt"

    @property
    def stderr_path(self) -> str:
        return f"{AGENT_LOG_DIR}/{self.name}.stderr.txt"

    def script(self) -> str:
        cmd = " ".join(shlex.quote(a) for a in self.argv)
        # `exec` so the in-sandbox timeout's kill reaches the agent itself; stdin from
        # /dev/null so no CLI waits for piped input.
        setup = f"{{ {self.setup}; }} && " if self.setup else ""
        return (
            f"mkdir -p {shlex.quote(self.home)} {AGENT_LOG_DIR} && {setup}"
            f"exec {cmd} < /dev/null > {self.stdout_path} 2> {self.stderr_path}"
        )


def skills_setup(skills_dir: str | None, dest: str) -> str:
    """Shell that copies a task's `[environment] skills_dir` (a path in the sandbox) into
    `dest`, where the CLI reads skills, as Harbor's installed agents do (`cp -r DIR/* DEST/`,
    errors ignored: an empty or missing directory gives no skills); "" without one."""
    if skills_dir is None:
        return ""
    target = shlex.quote(dest)
    return f"mkdir -p {target} && (cp -r {shlex.quote(skills_dir)}/. {target}/ 2>/dev/null || true)"


async def check_mounted(ctx: ScaffoldContext, binary: str, user: str | int | None) -> None:
    """Raise `ScaffoldSetupFailed` when `binary` is not executable inside the sandbox
    (the sandbox was created without this scaffold's `mounts()`)."""
    res = await ctx.sandbox.exec(["test", "-x", binary], timeout_s=30, user=user)
    if not res.ok:
        raise ScaffoldSetupFailed(
            f"{binary} is not executable in sandbox {ctx.sandbox.id}; create the sandbox with the "
            "scaffold's mounts()"
        )


async def _count_lines(ctx: ScaffoldContext, path: str) -> int | None:
    try:
        res = await ctx.sandbox.exec(["bash", "-c", f"wc -l < {shlex.quote(path)}"], timeout_s=15)
    except TrialflowError:
        return None  # the agent exec reports a lost sandbox; a poll must not hide that
    try:
        return int(res.stdout.strip()) if res.ok else None
    except ValueError:
        return None


async def _read_logs(ctx: ScaffoldContext, run: CliRun) -> tuple[str, str]:
    with tempfile.TemporaryDirectory(prefix="trialflow-agent-logs-") as tmp:
        texts = []
        for remote in (run.stdout_path, run.stderr_path):
            try:
                local = await ctx.sandbox.download(remote, tmp)
            except SandboxPathNotFound:
                texts.append("")
                continue
            texts.append(local.read_text(encoding="utf-8", errors="replace"))
            if ctx.log_dir is not None:
                ctx.log_dir.mkdir(parents=True, exist_ok=True)
                shutil.copy(local, ctx.log_dir / local.name)
    return texts[0], texts[1]


async def run_cli(
    ctx: ScaffoldContext, run: CliRun, *, user: str | int | None, poll_s: float = HEARTBEAT_POLL_S
) -> ScaffoldResult:
    """Run `run` in the sandbox; see the module docstring. Infra errors propagate."""
    started = time.monotonic()
    if user is not None and str(user) not in ("0", "root"):
        # A non-root agent user cannot create /logs/agent (or its HOME under a root-owned
        # parent): make both as root and hand them over.
        dirs = f"{AGENT_LOG_DIR} {shlex.quote(run.home)}"
        prep = await ctx.sandbox.exec(
            f"mkdir -p {dirs} && chown {shlex.quote(str(user))} {dirs}", timeout_s=30, user="0"
        )
        if not prep.ok:
            raise ScaffoldSetupFailed(f"could not prepare {dirs} for user {user}: {prep.stderr.strip()}")
    agent = asyncio.create_task(
        ctx.sandbox.exec(run.script(), timeout_s=ctx.timeout_s, env={**run.env, **ctx.env}, user=user)
    )
    try:
        while True:
            done, _ = await asyncio.wait({agent}, timeout=poll_s)
            if done:
                break
            lines = await _count_lines(ctx, run.stdout_path)
            ctx.heartbeat(
                {
                    "scaffold": run.name,
                    "output_lines": lines,
                    "elapsed_s": round(time.monotonic() - started, 1),
                }
            )
        res = agent.result()
    finally:
        if not agent.done():  # cancelled from outside: the exec's own timeout still kills the agent
            agent.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await agent
    stdout, stderr = await _read_logs(ctx, run)
    if res.stderr.strip():  # the wrapper's own complaints (mkdir, missing binary) go here
        stderr = f"{stderr}\n{res.stderr}" if stderr else res.stderr
    return ScaffoldResult(res.exit_code, res.timed_out, stdout, stderr, time.monotonic() - started)


class CliScaffold(Scaffold):
    """A host-installed CLI run in the sandbox as the task's agent user.

    Subclasses set `binary` (name under `MOUNT_DIR`), `candidates` (paths under the npm
    `node_modules` to look for it) and implement `command` / `summarize`.
    Options every CLI scaffold takes: `install_dir` (host `node_modules`; default
    `DEFAULT_INSTALL_DIR`) and `extra_args` (inserted before the instruction).
    """

    binary: str
    candidates: Sequence[str]

    def __init__(self, *, install_dir: str | Path | None = None, extra_args: Sequence[str] = ()) -> None:
        self.install_dir = Path(install_dir) if install_dir else DEFAULT_INSTALL_DIR
        self.extra_args = tuple(extra_args)

    @property
    def in_sandbox(self) -> str:
        return f"{MOUNT_DIR}/{self.binary}"

    def mounts(self) -> Sequence[Mount]:
        return (cli_mount(find_binary(self.install_dir, self.candidates, what=self.name), self.binary),)

    @abc.abstractmethod
    def command(self, ctx: ScaffoldContext) -> CliRun:
        """The agent command for `ctx`. Raises `ScaffoldSetupFailed` when `ctx` lacks what
        the CLI needs (proxy URL, model)."""

    @abc.abstractmethod
    def summarize(self, stdout: str) -> Any:
        """A dataclass folding the CLI's stdout (pure)."""

    async def run(self, ctx: ScaffoldContext) -> ScaffoldResult:
        run = self.command(ctx)
        user = ctx.task.config.agent.user
        await check_mounted(ctx, self.in_sandbox, user)
        result = await run_cli(ctx, run, user=user)
        summary = self.summarize(result.stdout)
        if ctx.log_dir is not None:
            ctx.log_dir.mkdir(parents=True, exist_ok=True)
            (ctx.log_dir / f"{run.name}.summary.json").write_text(json.dumps(asdict(summary), indent=2))
        if result.timed_out:
            return result
        return replace(result, stop_reason=self.stop_reason(summary), detail=self.detail(summary))

    def stop_reason(self, summary: Any) -> StopReason | None:
        """Why the CLI stopped, from its `summarize` fold (pure); None: not known. The base
        knows nothing; CLIs that report a turn limit override this."""
        return None

    def detail(self, summary: Any) -> str | None:
        """The CLI's own message about a failed ending, from its `summarize` fold (pure);
        None: none given."""
        return None
