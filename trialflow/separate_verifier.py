"""The separate verifier environment (`[verifier] environment_mode = "separate"` or
`[verifier.environment]`), as Harbor 0.25 runs a single-step trial's verifier there.

Order, per verification (a multi-step task's step: the same, once per step, on the step's
`Task.step_view`; Harbor's MultiStepTrial):
1. the agent sandbox's processes are killed from outside (`Sandbox.stop_processes`:
   Harbor stops the agent environment after collecting; nothing the agent left runs
   while its files are copied, and the workflow's teardown removes the container). Not
   before a multi-step task's steps other than the last (`stop_agent=False`): the next
   step's agent continues in that sandbox, so Harbor leaves it running then;
2. the task's artifacts (`/logs/artifacts` and each `artifacts` entry) are copied out of
   it through the backend's file API (`trialflow.artifacts.collect_artifacts`): the same
   copy goes to the store and, sanitized, into the verifier;
3. a fresh sandbox is created from `Task.separate_verifier` (an image built from tests/,
   `[verifier.environment].docker_image`, or else the agent's image; the verifier
   environment's resources, env and workdir; no mounts; `--network none` like every
   sandbox; `verifier_for` the agent's, so the agent's teardown removes it should this
   never get to) and started (its ENTRYPOINT runs, as for the agent's; its healthcheck is
   not run: Harbor 0.25 gates only the agent's environment);
4. the artifacts are put at their source paths (`trialflow.artifacts.upload_artifacts`);
5. test.sh runs there (`trialflow.verifier.run_tests`: `[verifier].user`, `[verifier].env`,
   `[verifier].timeout_sec`; tests/ uploaded unless the image brings its own /tests), in
   the network mode of `[verifier]`, else of the verifier's environment;
6. the verifier sandbox is removed, whatever happened (shielded from cancellation): a
   step's verifier sandbox is gone before the next step starts.

Reward integrity: the verifier sandbox receives nothing from the agent's but the artifact
files, copied by the worker (no shared mount, no shared namespace, no agent process); a
file the agent planted elsewhere, a process it left, a binary it replaced, a symlink out
of an artifact: none reaches the verifier. What the task declares as artifacts is the
agent's to write, by design.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

from trialflow.artifacts import ArtifactRow, collect_artifacts, upload_artifacts
from trialflow.sandbox.base import Sandbox, SandboxBackend
from trialflow.sandbox.egress import Egresses
from trialflow.sandbox.network import NetworkPolicy, network_policy
from trialflow.sandbox.transfer import Allowance
from trialflow.tasks import Task
from trialflow.verifier import VerifierResult, run_tests


@dataclass(frozen=True)
class SeparateVerification:
    result: VerifierResult
    manifest: list[ArtifactRow]  # the artifacts collected from the agent's sandbox (as collect_artifacts)


async def verify_separately(
    backend: SandboxBackend,
    agent: Sandbox,
    task: Task,
    *,
    trial_id: str,
    artifacts_dir: Path,
    labels: dict[str, str] | None = None,
    timeout_s: float | None = None,
    log_dir: Path | None = None,
    egresses: Egresses | None = None,
    stop_agent: bool = True,
    allowance: Allowance | None = None,
    network: NetworkPolicy | None = None,
) -> SeparateVerification:
    """Verify `agent`'s work for `task` in a fresh verifier sandbox (module docstring).
    `artifacts_dir` receives the collected artifacts (its manifest is returned);
    `log_dir`, `timeout_s` as `run_tests`; `stop_agent` False leaves the agent's processes
    running (step 1 of the module docstring); `allowance`: the artifacts' budget
    (`collect_artifacts`; over it, `OutputBudgetExceeded` before any verifier sandbox is
    made); `network`: the verifier phase's policy (None: the task's, under the default run
    choices, `network_policy`). Raises what the backend raises for
    infrastructure failures (SandboxLost, SandboxStartFailed, ImageUnavailable, ...)."""
    separate = task.separate_verifier
    if separate is None:
        raise ValueError(f"task {task.name} verifies in the agent's sandbox (shared mode)")
    egresses = egresses if egresses is not None else Egresses()
    if stop_agent:
        await agent.stop_processes()
    entries = task.config.artifact_entries()
    manifest = await collect_artifacts(agent, entries, artifacts_dir, allowance)
    verifier = await backend.create(task, trial_id=f"{trial_id}-verifier", labels=labels, verifier_for=agent)
    try:
        await verifier.start()
        policy = network if network is not None else network_policy(task, "verifier")
        env = await egresses.env_for(verifier, policy)
        await upload_artifacts(verifier, entries, manifest, artifacts_dir)
        result = await run_tests(
            verifier,
            task,
            timeout_s=timeout_s,
            log_dir=log_dir,
            env=env,
            bundled_tests=separate.bundled_tests,
        )
    finally:
        await asyncio.shield(_remove(verifier, egresses))
    return SeparateVerification(result, manifest)


async def _remove(verifier: Sandbox, egresses: Egresses) -> None:
    try:
        await egresses.close(verifier.id)
    finally:
        await verifier.stop()
