"""Verification activity: run the task's verifier in the sandbox, return the rewards.

Where: in the agent's sandbox (Harbor's shared mode, `trialflow.verifier.run_verifier`: the
sandbox restarted first, with the harness's own keep-alive and toolchain; also a sandbox the
agent stopped: that is the agent's outcome, verified from its files), or
in a fresh verifier sandbox for a task (or a multi-step task's step) with a separate
verifier environment (`trialflow.separate_verifier`: artifacts copied in; the verifier
sandbox is removed before the activity returns, and with the agent's at teardown should
the worker die first; the agent's processes are stopped first except before a step that
is not the task's last). A retry of this activity starts a new verifier sandbox from the
agent's unchanged files.

`VerifyOutput.verifier_trust` says which ("harness" / "separate").

Network: the verifier phase's policy (`trialflow.sandbox.network.resolve_network`: the task's
`[verifier]` / environment settings, Harbor's default ``public`` where it states none, the
run's `VerifyInput.network` over both). In shared mode its egress proxy is opened only after
the verification restart, in the restarted sandbox's network namespace (a new one; a compose
pod's holder keeps its own): no process of the agent's in the sandbox exists then (the restart killed its whole pid namespace; the launcher runs the
toolchain's sleep; the image's HEALTHCHECK is disabled on every sandbox), so nothing the
agent left can use it before test.sh starts. test.sh itself may run the agent's code
(`pytest` importing it): that code has the verifier's network while test.sh runs, as in
Harbor; a task that must not allow that sets `[verifier] network_mode = "no-network"`, a run
`verifier_network = "no-network"`; a compose pod's services, which run through the restart in
the same namespace, can use it too while test.sh runs (as in Harbor, whose egress control
covers the whole project). After test.sh the proxy is switched to no-network, its
open tunnels closed, so nothing test.sh left running keeps it into a next step's agent phase.

A verifier timeout or a missing/unparseable reward is an OUTCOME of the trial
(`reward_valid=False`, `reward_error` names the `VerifierError` type and message), not an
activity failure: retrying would not change it. A lost sandbox (`SandboxLost`) or other
infrastructure failure raises, and Temporal retries per the workflow's policy.

The task's artifacts (task.toml `artifacts` and /logs/artifacts, as Harbor collects them:
`trialflow.artifacts`) are collected just BEFORE the verifier runs, in either mode, as
Harbor collects them (so a verifier that changes or deletes them cannot change what is
stored), and go to the store under the attempt's ``logs/artifacts/`` with a
``manifest.json``. Artifacts and the verifier's files are copied within budgets
(`trialflow.sandbox.transfer`, the worker's `TransferLimits`): over one, the activity
fails with the non-retryable `OutputBudgetExceeded`, which the workflow records as the
trial's error (termination "verifier_error"), never a retry. A multi-step task's step (`VerifyInput.step`) is verified on `Task.step_view` (its tests over the shared ones, its
verifier settings, the task's artifacts plus the step's) and stored under the step's keys
(``.../steps/{key}/``).
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
from pathlib import Path

from temporalio import activity

from activities._support import heartbeat_interval, heartbeating, phase_network, typed_errors
from trialflow.artifacts import ArtifactRow, collect_artifacts
from trialflow.metrics import TrialMetrics
from trialflow.sandbox.base import Sandbox, SandboxBackend
from trialflow.sandbox.egress import Egresses
from trialflow.sandbox.network import NetworkPolicy, network_policy
from trialflow.sandbox.transfer import TransferLimits
from trialflow.separate_verifier import verify_separately
from trialflow.storage import ResultStore, TrialKeys
from trialflow.tasks import load_task
from trialflow.verifier import VerifierResult, run_verifier
from workflows.shared import VerifierTrust, VerifyInput, VerifyOutput


class VerifyActivities:
    def __init__(
        self,
        backend: SandboxBackend,
        store: ResultStore,
        metrics: TrialMetrics,
        egresses: Egresses | None = None,
        limits: TransferLimits | None = None,
    ) -> None:
        self._egresses = egresses if egresses is not None else Egresses()
        self._limits = limits or TransferLimits()
        self._backend = backend
        self._store = store
        self._metrics = metrics

    @activity.defn(name="trial.verify")
    async def verify(self, inp: VerifyInput) -> VerifyOutput:
        started = time.monotonic()
        with typed_errors():
            task = load_task(inp.task_path)
            step_key = task.step(inp.step).key if inp.step is not None else None
            # Harbor stops the agent's environment before a separate verifier only when no
            # step follows in it: a single-step task, or a multi-step task's last step.
            last = inp.step is None or task.steps[-1].name == inp.step
            if inp.step is not None:  # the step's tests, verifier settings and artifacts
                task = task.step_view(inp.step)
            keys = TrialKeys(inp.batch_id, inp.trial_id, inp.attempt, step_key)
            policy = network_policy(task, "verifier", phase_network(inp.network, "verifier"))
            sandbox = await self._backend.attach(inp.sandbox_id)
            async with heartbeating(interval_s=heartbeat_interval()):
                with (
                    tempfile.TemporaryDirectory(prefix="tf-verify-") as logs,
                    tempfile.TemporaryDirectory(prefix="tf-artifacts-") as artifacts,
                ):
                    if task.separate_verifier is None:
                        entries = task.config.artifact_entries()
                        manifest = await collect_artifacts(
                            sandbox, entries, Path(artifacts), self._limits.artifacts()
                        )

                        async def egress_env(restarted: Sandbox) -> dict[str, str]:
                            # The restart gave the sandbox a new network namespace (a pod keeps
                            # its holder's): the agent phase's proxy goes, with its tunnels. Opened
                            # only now, when no process of the agent's is left (module docstring).
                            await self._egresses.close(restarted.id)
                            return await self._egresses.env_for(restarted, policy)

                        try:
                            result = await run_verifier(
                                sandbox,
                                task,
                                env_after_restart=egress_env,
                                timeout_s=inp.verifier_timeout_s,
                                log_dir=Path(logs),
                            )
                        finally:
                            # What test.sh left running (it may run the agent's code) keeps
                            # nothing of the verifier's network: every tunnel closed, nothing
                            # new until the next phase sets its own policy.
                            await self._egresses.env_for(sandbox, NetworkPolicy("no-network"))
                        trust: VerifierTrust = "harness"
                    else:  # a fresh verifier sandbox (the step's own, for a step)
                        done = await verify_separately(
                            self._backend,
                            sandbox,
                            task,
                            trial_id=f"{inp.trial_id}-a{inp.attempt}" + (f"-s{step_key}" if step_key else ""),
                            labels={"trialflow.batch": inp.batch_id, "trialflow.attempt": str(inp.attempt)},
                            artifacts_dir=Path(artifacts),
                            timeout_s=inp.verifier_timeout_s,
                            log_dir=Path(logs),
                            egresses=self._egresses,
                            stop_agent=last,
                            allowance=self._limits.artifacts(),
                            network=policy,
                        )
                        result, manifest = done.result, done.manifest
                        trust = "separate"
                    await self._store_logs(keys, Path(logs), result)
                    await self._store_artifacts(keys, Path(artifacts), manifest)
        seconds = time.monotonic() - started
        self._metrics.phase_seconds.labels("verify").observe(seconds)
        problem = result.error()
        return VerifyOutput(
            rewards=dict(result.rewards),
            reward=result.reward if problem is None else 0.0,
            reward_valid=problem is None,
            reward_error=f"{type(problem).__name__}: {problem}" if problem is not None else None,
            seconds=seconds,
            verifier_trust=trust,
        )

    async def _store_artifacts(self, keys: TrialKeys, root: Path, manifest: list[ArtifactRow]) -> None:
        """Artifacts next to the attempt's logs: ``logs/artifacts/...`` plus manifest.json.
        Each file is streamed from disk; a link inside an artifact is not stored again (its
        target is, once: the budget charged it once)."""
        files = await asyncio.to_thread(
            lambda: sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink())
        )
        for path in files:
            key = keys.log(f"artifacts/{path.relative_to(root)}")
            await asyncio.to_thread(self._store.put_file, key, path)
        body = json.dumps(manifest, indent=1).encode()
        await asyncio.to_thread(self._store.put_bytes, keys.log("artifacts/manifest.json"), body)

    async def _store_logs(self, keys: TrialKeys, log_dir: Path, result: VerifierResult) -> None:
        """Verifier output next to the attempt: stdout/stderr and whatever /logs/verifier held."""
        objects = {
            "verifier/stdout.txt": result.stdout.encode(),
            "verifier/stderr.txt": result.stderr.encode(),
        }
        for name, data in objects.items():
            await asyncio.to_thread(self._store.put_bytes, keys.log(name), data)
        files = await asyncio.to_thread(
            lambda: sorted(p for p in log_dir.rglob("*") if p.is_file() and not p.is_symlink())
        )
        for path in files:
            key = keys.log(f"verifier/files/{path.relative_to(log_dir)}")
            await asyncio.to_thread(self._store.put_file, key, path)
