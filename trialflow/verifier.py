"""Verifier: runs a task's tests/test.sh in the sandbox and reads the reward it writes.

Steps (Harbor semantics): upload tests/ to `/tests`, `mkdir -p /logs/verifier` (old reward
files removed first, so a stale reward can never be read), run `bash /tests/test.sh` with
`[verifier].env` as `[verifier].user` under `[verifier].timeout_sec`, then read
`/logs/verifier/reward.json` (a JSON object of name -> number) or, when absent,
`/logs/verifier/reward.txt` (one number, stored as `{"reward": x}`).

Outcomes are data (`VerifierResult`), never exceptions:
- exit code of test.sh is recorded but does not decide validity (tests commonly write
  reward 0 and exit 1);
- timeout -> `reward_valid=False`, reason "verifier timed out ..." (a reward written before the
  timeout is ignored: the run is incomplete);
- no reward file, unparseable content, a non-object JSON, non-numeric / bool / NaN / inf values
  or an empty object -> `reward_valid=False` with the reason;
- stdout/stderr are always kept. `VerifierResult.error()` classifies a failure as a typed
  `VerifierTimeout` / `RewardMissing` without raising.
Only infrastructure failures (sandbox gone) raise, as `SandboxLost`.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from trialflow.errors import RewardMissing, VerifierError, VerifierTimeout
from trialflow.sandbox.base import Sandbox
from trialflow.tasks import Task

TESTS_DIR = "/tests"
VERIFIER_LOG_DIR = "/logs/verifier"
REWARD_JSON = f"{VERIFIER_LOG_DIR}/reward.json"
REWARD_TXT = f"{VERIFIER_LOG_DIR}/reward.txt"


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
        if not self.reward_valid or not self.rewards:
            return 0.0
        if "reward" in self.rewards:
            return self.rewards["reward"]
        return sum(self.rewards.values()) / len(self.rewards)

    def error(self) -> VerifierError | None:
        """The typed classification of a failed verification, or None when valid."""
        if self.reward_valid:
            return None
        return (VerifierTimeout if self.timed_out else RewardMissing)(self.reason or "invalid reward")


def _number(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"reward {name!r} is not a number: {value!r}")  # noqa: TRY004 (one error type for all bad content)
    out = float(value)
    if not math.isfinite(out):
        raise ValueError(f"reward {name!r} is not finite: {value!r}")
    return out


def parse_reward_json(text: str) -> dict[str, float]:
    """Parse reward.json; raises ValueError naming the problem."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"reward.json is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise ValueError(  # noqa: TRY004 (one error type for all bad content)
            f"reward.json must be an object of name -> number, got {type(data).__name__}"
        )
    if not data:
        raise ValueError("reward.json is an empty object")
    return {str(k): _number(str(k), v) for k, v in data.items()}


def parse_reward_txt(text: str) -> dict[str, float]:
    """Parse reward.txt (one number, surrounding whitespace allowed); raises ValueError."""
    stripped = text.strip()
    try:
        value = float(stripped)
    except ValueError:
        raise ValueError(f"reward.txt does not hold one number: {stripped[:80]!r}") from None
    return {"reward": _number("reward", value)}


def parse_rewards(json_text: str | None, txt_text: str | None) -> dict[str, float]:
    """reward.json wins when both exist; raises ValueError when neither parses."""
    if json_text is not None:
        return parse_reward_json(json_text)
    if txt_text is not None:
        return parse_reward_txt(txt_text)
    raise ValueError(f"test.sh wrote neither {REWARD_JSON} nor {REWARD_TXT}")


async def _read_optional(sandbox: Sandbox, path: str) -> str | None:
    """Content of `path`, or None when it is not a regular file. Read as root: the verifier
    user may have written it with a restrictive umask."""
    res = await sandbox.exec(["sh", "-c", 'test -f "$1" && cat "$1"', "sh", path], user="0", timeout_s=60)
    return res.stdout if res.exit_code == 0 else None


async def run_verifier(
    sandbox: Sandbox, task: Task, *, timeout_s: float | None = None, log_dir: Path | None = None
) -> VerifierResult:
    """Verify the sandbox's current state for `task`. `timeout_s` overrides
    `[verifier].timeout_sec`. When `log_dir` is given, /logs/verifier is downloaded into it
    (best effort: the verifier may have written nothing)."""
    cfg = task.config.verifier
    timeout = timeout_s if timeout_s is not None else cfg.timeout_sec
    prep = await sandbox.exec(
        f"rm -rf {TESTS_DIR} && rm -f {REWARD_JSON} {REWARD_TXT} && mkdir -p {VERIFIER_LOG_DIR} "
        f"&& chmod 777 {VERIFIER_LOG_DIR}",
        user="0",
        timeout_s=60,
    )
    if not prep.ok:
        return VerifierResult(
            {},
            False,
            f"could not prepare {VERIFIER_LOG_DIR}: {prep.stderr.strip()}",
            prep.exit_code,
            False,
            prep.stdout,
            prep.stderr,
            prep.duration_s,
        )
    await sandbox.upload(task.tests_dir, TESTS_DIR)
    run = await sandbox.exec(
        f"bash {TESTS_DIR}/test.sh", timeout_s=timeout, env=cfg.env or None, user=cfg.user
    )
    files: dict[str, str] = {}
    rewards: dict[str, float] = {}
    reason: str | None = None
    if run.timed_out:
        reason = f"verifier timed out after {timeout:g}s"
    else:
        json_text = await _read_optional(sandbox, REWARD_JSON)
        txt_text = await _read_optional(sandbox, REWARD_TXT)
        files = {k: v for k, v in (("reward.json", json_text), ("reward.txt", txt_text)) if v is not None}
        try:
            rewards = parse_rewards(json_text, txt_text)
        except ValueError as e:
            reason = f"{e} (test.sh exit code {run.exit_code})"
    if log_dir is not None:
        try:
            await sandbox.download(VERIFIER_LOG_DIR, log_dir)
        except FileNotFoundError:
            pass
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
