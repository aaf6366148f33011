"""Verifier: runs a task's tests/test.sh in a sandbox and reads the reward it writes.

Steps (Harbor semantics, plus what keeps the policy from touching its reward):
`run_verifier` (Harbor's shared mode, in the agent's sandbox) first restarts the sandbox
(`Sandbox.restart_for_verification`: every process ends, the keep-alive included, and the
sandbox starts again from its files with a keep-alive from the harness's toolchain, so no
daemon, tampered keep-alive or process the agent touched runs during verification; a
sandbox the agent stopped is restarted the same way) and removes `/etc/ld.so.preload`; then
`run_tests` recreates an empty `/logs/verifier` with the toolchain's rm/mkdir/chmod (checked
empty through the backend's file API), uploads tests/ to `/tests` (unless a separate
verifier's image brings its own), runs `/tests/test.sh` directly through the toolchain's `env`
with a cleaned environment (`trialflow.verifier_env`: its shebang counts, as in Harbor) with
`[verifier].env` as `[verifier].user` under `[verifier].timeout_sec` (enforced from the
host), then reads `/logs/verifier/reward.json` (a JSON object of name -> number) or, when
absent, `/logs/verifier/reward.txt` (one number, stored as `{"reward": x}`), both copied out
through the backend's file API (`Sandbox.download`), never read with a binary from the
sandbox (a replaced `cat` could print any reward); a symlinked reward file is refused.
What the shared mode does not cover: test.sh's own interpreters come from the image the
agent worked in (`/bin/bash`, python and its site-packages, the C library test.sh's tools
load): an agent that replaced them can still fool a verifier that runs in its sandbox; a
task's separate verifier environment (`trialflow.separate_verifier`: `run_tests` in a fresh
sandbox that gets only the artifacts) is the answer to that (docs/design.md, "Reward
integrity"). A restart the engine refuses on what the agent left (`SandboxRestartFailed`),
and in the agent's sandbox a preparation the toolchain cannot finish there (/tests or
/logs/verifier cannot be made fresh), are the agent's outcome: reward 0, valid, the cause in
stderr (an invalid reward would be masked in training: a way out of a failing score). /tests
and /logs/verifier are moved aside (one rename, however many files the agent put there),
else emptied in place (a read-only root's volume mount points).

Outcomes are data (`VerifierResult`), never exceptions:
- exit code of test.sh is recorded but does not decide validity (tests commonly write
  reward 0 and exit 1);
- timeout -> `reward_valid=False`, reason "verifier timed out ..." (a reward written before the
  timeout is ignored: the run is incomplete);
- no reward file, unparseable content, a non-object JSON, non-numeric / bool / NaN / inf values
  (also an integer beyond float range), an empty object, a file over `REWARD_MAX_BYTES` or
  JSON nested deeper than the decoder takes -> `reward_valid=False` with the reason;
- reward.txt is read as Harbor 0.25 reads it: Python's `float()` of the whole text, so what
  `float` takes counts (surrounding whitespace, `1e-3`, `+1`, and digit-group underscores:
  `1_0` is 10.0 in Harbor as here); Harbor declares no reward range in task.toml, so none is
  applied (a reward of 7 or -3 is the verifier's to give);
- stdout/stderr are always kept. `VerifierResult.error()` classifies a failure as a typed
  `VerifierTimeout` / `RewardMissing` without raising.
Only infrastructure failures (sandbox gone) raise, as `SandboxLost`.
"""

from __future__ import annotations

import json
import math
import shutil
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from trialflow.errors import RewardMissing, SandboxRestartFailed, VerifierError, VerifierTimeout
from trialflow.sandbox.base import ExecResult, Sandbox
from trialflow.sandbox.toolchain import BUSYBOX, tool
from trialflow.tasks import Task
from trialflow.verifier_env import verifier_command

TESTS_DIR = "/tests"
TEST_SH = f"{TESTS_DIR}/test.sh"
LD_SO_PRELOAD = "/etc/ld.so.preload"
VERIFIER_LOG_DIR = "/logs/verifier"
REWARD_JSON = f"{VERIFIER_LOG_DIR}/reward.json"
REWARD_TXT = f"{VERIFIER_LOG_DIR}/reward.txt"
# A reward file is a number or a small object of numbers; anything larger is not a reward
# (and is never read whole into memory).
REWARD_MAX_BYTES = 64 * 1024


@dataclass(frozen=True)
class VerifierResult:
    rewards: dict[str, float]
    reward_valid: bool
    reason: str | None
    exit_code: int
    timed_out: bool
    stdout: str
    stderr: str
    duration_s: float
    files: dict[str, str] = field(default_factory=dict)  # raw reward file contents, by name

    @property
    def reward(self) -> float:
        """Scalar reward: `rewards["reward"]` if present, else the mean of all values;
        0.0 when the reward is invalid."""
        return scalar_reward(self.rewards) if self.reward_valid else 0.0

    def error(self) -> VerifierError | None:
        """The typed classification of a failed verification, or None when valid."""
        if self.reward_valid:
            return None
        return (VerifierTimeout if self.timed_out else RewardMissing)(self.reason or "invalid reward")


def scalar_reward(rewards: dict[str, float]) -> float:
    """The one scalar of a rewards dict: its "reward" key if present, else the mean of
    all values; 0.0 for an empty dict."""
    if not rewards:
        return 0.0
    if "reward" in rewards:
        return rewards["reward"]
    return sum(rewards.values()) / len(rewards)


def _number(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"reward {name!r} is not a number: {value!r}")  # noqa: TRY004 (one error type for all bad content)
    try:
        out = float(value)
    except OverflowError:  # a JSON integer beyond float range (json keeps ints exact)
        raise ValueError(f"reward {name!r} is not finite: an integer of {len(str(value))} digits") from None
    if not math.isfinite(out):
        raise ValueError(f"reward {name!r} is not finite: {value!r}")
    return out


def parse_reward_json(text: str) -> dict[str, float]:
    """Parse reward.json; raises ValueError naming the problem (never another error)."""
    _check_size("reward.json", text)
    try:
        data = json.loads(text)
    except RecursionError:
        raise ValueError(
            "reward.json is nested too deeply to decode (a reward is an object of numbers)"
        ) from None
    except ValueError as e:  # JSONDecodeError, and ints past Python's digit limit
        raise ValueError(f"reward.json is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise ValueError(  # noqa: TRY004 (one error type for all bad content)
            f"reward.json must be an object of name -> number, got {type(data).__name__}"
        )
    if not data:
        raise ValueError("reward.json is an empty object")
    return {str(k): _number(str(k), v) for k, v in data.items()}


def parse_reward_txt(text: str) -> dict[str, float]:
    """Parse reward.txt as Harbor does (`float()` of the text: surrounding whitespace and
    underscores between digits allowed, module docstring); raises ValueError."""
    _check_size("reward.txt", text)
    stripped = text.strip()
    try:
        value = float(stripped)
    except ValueError:
        raise ValueError(f"reward.txt does not hold one number: {stripped[:80]!r}") from None
    return {"reward": _number("reward", value)}


def _check_size(name: str, text: str) -> None:
    # as read by `_read_local` (invalid bytes replaced: such a file is no reward either way)
    size = len(text.encode("utf-8"))
    if size > REWARD_MAX_BYTES:
        raise ValueError(f"{name} is over the {REWARD_MAX_BYTES}-byte limit of a reward file")


def parse_rewards(json_text: str | None, txt_text: str | None) -> dict[str, float]:
    """reward.json wins when both exist; raises ValueError when neither parses."""
    if json_text is not None:
        return parse_reward_json(json_text)
    if txt_text is not None:
        return parse_reward_txt(txt_text)
    raise ValueError(f"test.sh wrote neither {REWARD_JSON} nor {REWARD_TXT}")


def _read_local(path: Path) -> str | None:
    """Content of a downloaded reward file; None unless it is a regular file (a symlink is
    refused: it could point anywhere on the host copy's side). At most one byte more than
    `REWARD_MAX_BYTES` is read: enough for the parsers to refuse a larger file."""
    if path.is_symlink() or not path.is_file():
        return None
    with path.open("rb") as f:
        return f.read(REWARD_MAX_BYTES + 1).decode("utf-8", errors="replace")


async def _head(sandbox: Sandbox, path: str, scratch: Path) -> bytes:
    """The first two bytes of a file in the sandbox, read through the backend."""
    try:
        local = await sandbox.download(path, scratch)
    except FileNotFoundError:
        return b""
    with local.open("rb") as f:
        return f.read(2)


async def _fetch_verifier_dir(sandbox: Sandbox, dest: Path) -> bool:
    """Copy /logs/verifier out through the backend's file API (not a binary in the sandbox);
    False when it does not exist."""
    try:
        await sandbox.download(VERIFIER_LOG_DIR, dest)
    except FileNotFoundError:
        return False
    return True


def _invalid(reason: str, res: ExecResult | None = None) -> VerifierResult:
    return VerifierResult(
        {},
        False,
        reason,
        res.exit_code if res else -1,
        False,
        res.stdout if res else "",
        res.stderr if res else "",
        res.duration_s if res else 0.0,
    )


def _agent_outcome(reason: str, res: ExecResult) -> VerifierResult:
    """Reward 0, valid: the verification could not run on what the agent left (shared mode)."""
    note = f"[trialflow: {reason}; the agent's outcome: reward 0]"
    return VerifierResult(
        {"reward": 0.0}, True, None, res.exit_code, res.timed_out, res.stdout, note, res.duration_s
    )


async def run_verifier(
    sandbox: Sandbox,
    task: Task,
    *,
    timeout_s: float | None = None,
    log_dir: Path | None = None,
    env: dict[str, str] | None = None,
    env_after_restart: Callable[[Sandbox], Awaitable[dict[str, str]]] | None = None,
) -> VerifierResult:
    """Verify the agent sandbox's current state for `task` (Harbor's shared mode): the
    verification restart, then `run_tests` (module docstring). `env_after_restart` makes
    settings that need the restarted sandbox (the egress proxy's listener lives in its new
    network namespace); they are added to `env`. A task with a separate verifier
    environment is refused (ValueError): `trialflow.separate_verifier` verifies those."""
    if task.separate_verifier is not None:
        raise ValueError(
            f"task {task.name} has a separate verifier environment: verify it with "
            "trialflow.separate_verifier.verify_separately, not in the agent's sandbox"
        )
    try:
        await sandbox.restart_for_verification()
    except SandboxRestartFailed as e:
        # What the agent left decided it; an invalid reward would let it escape its score.
        note = f"[trialflow: {e}; the agent's outcome: reward 0]"
        return VerifierResult({"reward": 0.0}, True, None, -1, False, "", note, 0.0)
    if env_after_restart is not None:
        env = {**(env or {}), **await env_after_restart(sandbox)}
    return await run_tests(sandbox, task, timeout_s=timeout_s, log_dir=log_dir, env=env, agent_sandbox=True)


async def run_tests(
    sandbox: Sandbox,
    task: Task,
    *,
    timeout_s: float | None = None,
    log_dir: Path | None = None,
    env: dict[str, str] | None = None,
    bundled_tests: bool = False,
    agent_sandbox: bool = False,
) -> VerifierResult:
    """Run test.sh in `sandbox` and read its reward (module docstring). `timeout_s`
    overrides `[verifier].timeout_sec`; `env` (e.g. the egress proxy's) is added under
    `[verifier].env`. When `log_dir` is given, /logs/verifier is downloaded into it (best
    effort: the verifier may have written nothing). `bundled_tests`: the sandbox is a
    separate verifier whose image brings its own /tests (not replaced by tests/).
    `agent_sandbox`: the agent worked in this sandbox (shared mode): /etc/ld.so.preload is
    removed too."""
    cfg = task.config.verifier
    timeout = timeout_s if timeout_s is not None else cfg.timeout_sec
    fresh = [VERIFIER_LOG_DIR] if bundled_tests else [TESTS_DIR, VERIFIER_LOG_DIR]
    b = BUSYBOX
    # Moved aside (one rename, however many files the agent left there), else emptied in
    # place (with a read-only root /tests is a volume's mount point, which cannot move); a
    # link or a file in a directory's place goes (the toolchain's rm does not follow links).
    script = " && ".join(
        f"{{ if [ -L {d} ] || [ -e {d} ]; then {b} mv {d} {d}.trialflow-old.$$ 2>/dev/null || "
        f"{{ {{ if [ -L {d} ] || [ ! -d {d} ]; then {b} rm -f {d}; fi; }} && "
        f"{b} find {d} -mindepth 1 -maxdepth 1 -exec {b} rm -rf {{}} +; }}; fi; }} && {b} mkdir -p {d}"
        for d in fresh
    )
    if agent_sandbox:  # planted for test.sh's interpreters (a static toolchain ignores it)
        script += f" && {b} rm -rf {LD_SO_PRELOAD}"
    prep = await sandbox.exec(
        tool("sh", "-c", f"{script} && {b} chmod 777 {VERIFIER_LOG_DIR}"),
        user="0",
        timeout_s=60,
    )
    # In the agent's sandbox only what the agent left can make the trusted toolchain fail
    # here: its outcome (reward 0), not an invalid reward it could aim for.
    failed = _agent_outcome if agent_sandbox else _invalid
    if not prep.ok:
        return failed(f"could not prepare {VERIFIER_LOG_DIR}: {prep.stderr.strip()}", prep)
    with tempfile.TemporaryDirectory(prefix="tf-verifier-") as scratch:
        # Checked from outside, as a second line behind the toolchain's rm.
        before = Path(scratch) / "before"
        if not await _fetch_verifier_dir(sandbox, before) or any(before.iterdir()):
            return failed(f"{VERIFIER_LOG_DIR} could not be cleared before the verifier ran", prep)
        if bundled_tests:
            # A fresh verifier sandbox no agent touched; the toolchain's chmod all the same
            # (Harbor runs `chmod +x` there too).
            mark = await sandbox.exec(tool("chmod", "+x", TEST_SH), user="0", timeout_s=60)
            if not mark.ok:
                return _invalid(
                    f"the verifier image has no {TEST_SH} (an image built from tests/ or "
                    f"[verifier.environment].docker_image brings its own tests): {mark.stderr.strip()}",
                    mark,
                )
            head = await _head(sandbox, TEST_SH, Path(scratch) / "head")
        else:
            tests = Path(scratch) / "tests"
            shutil.copytree(task.tests_dir, tests)  # links followed: the chmod stays in the copy
            if task.tests_overlay is not None:  # a step's tests/ over the shared ones, as Harbor uploads them
                shutil.copytree(task.tests_overlay, tests, dirs_exist_ok=True)
            (tests / "test.sh").chmod((tests / "test.sh").stat().st_mode | 0o111)
            head = (tests / "test.sh").read_bytes()[:2]
            await sandbox.upload(tests, TESTS_DIR)
        # As Harbor: run directly, so its shebang counts (`#!/usr/bin/env python3` works); a
        # script without one runs under bash. Harbor chmods it in the sandbox; here the
        # executable bit is set in the uploaded copy.
        argv = verifier_command(
            TEST_SH, head == b"#!", await sandbox.base_environment(), {**(env or {}), **cfg.env}
        )
        run = await sandbox.exec(argv, timeout_s=timeout, user=cfg.user)
        after = log_dir if log_dir is not None else Path(scratch) / "after"
        fetched = await _fetch_verifier_dir(sandbox, after)
        files: dict[str, str] = {}
        rewards: dict[str, float] = {}
        reason: str | None = None
        if run.timed_out:
            reason = f"verifier timed out after {timeout:g}s"
        else:
            json_text = _read_local(after / "reward.json") if fetched else None
            txt_text = _read_local(after / "reward.txt") if fetched else None
            files = {k: v for k, v in (("reward.json", json_text), ("reward.txt", txt_text)) if v is not None}
            try:
                rewards = parse_rewards(json_text, txt_text)
            except ValueError as e:
                reason = f"{e} (test.sh exit code {run.exit_code})"
    return VerifierResult(
        rewards,
        reason is None,
        reason,
        run.exit_code,
        run.timed_out,
        run.stdout,
        run.stderr,
        run.duration_s,
        files,
    )
