"""Scaffold activity: run the agent in its sandbox, pointed at this worker's proxy.

Per attempt: open a proxy session whose checkpoint sink writes every turn to
`TrialKeys.checkpoints` in the store, run the scaffold under the agent timeout, close the
session, write `TrialKeys.trajectory` and the scaffold logs, return counters. Scaffolds
that need no model (oracle, nop) get no session and no trajectory. A multi-step task's step
(`ScaffoldInput.step`) runs the same way on `Task.step_view` (its instruction, its solution
for the oracle) with a session of its own under the step's keys (``.../steps/{key}/``).

Outcomes vs failures:
- agent timeout       -> outcome "timeout" (the workflow verifies anyway)
- token budget        -> `ScaffoldInput.max_context_tokens` / `max_response_tokens` (the trainer's
  sample budget) become the session's limits, and the session ends the agent's turns at the
  first overlong turn (`SessionConfig.overlong_ends_session`): outcome "overlong", verified
- turn limit reached  -> outcome "max_turns" (the agent's own: `ScaffoldResult.stop_reason`; the
  session's, `Scaffold.session_max_turns`: the proxy refused a turn; verified anyway)
- non-zero exit       -> outcome "scaffold_error" with `error` set (verified anyway)
- the sandbox stopped under the agent but is still there (it killed its keep-alive)
                      -> outcome "scaffold_error", verified from its files (the verify
                         activity restarts it): the agent's doing, never an infra_error
- typed infra errors  -> raised as ApplicationError (retryable or not per trialflow.errors);
  the workflow starts a new attempt for retryable ones (it replays this attempt's recorded
  turns, so the retry costs the replicas nothing up to the failure).
- the agent saw infrastructure -> retryable `ReplicaUnavailable`, whatever the agent's exit
  code, so such an attempt is never verified and trained as the model's outcome; its last
  attempt ends the trial "infra_error" (reward invalid, masked in training). `infra_cause`
  decides, from the session's counters: a request answered with an infrastructure error
  (no replica within the proxy's outage hold, `counters.infra_errors`; the session then fails
  every later request at once, `SessionConfig.infra_ends_session`), a request still held when
  the agent was stopped (counted the same), an agent timeout in an attempt whose turns were
  held for an outage (`counters.outage_holds`: the outage ate the agent's time), or an agent
  that failed while no replica of its pool answers a fresh health probe. The trajectory and
  logs are stored first. A
  scaffold that needs a model on a worker without one raises non-retryable
  `ModelNotConfigured`. The spec's sampling settings were validated when it was made.
Resume by replay: with `ScaffoldInput.replay_from` set, the session is seeded with that
attempt's record (its final trajectory, else its checkpoints; `trialflow.storage.load_attempt`)
and answers from it while the scaffold's requests match (proxy.replay); the output counts the
replayed turns and says where the replay stopped. Ids derive from the trial id, so every
attempt of a trial hands out the same ids.
While running, the activity heartbeats its live counters (`ScaffoldHeartbeat`) and signals
them to the workflow (`report_progress`) when they change, feeding the workflow's
`progress` query. `ScaffoldContext.heartbeat(details)` from the scaffold is an activity
heartbeat too, carrying the counters and `details` (the latest ones, in every beat after).
A worker killed mid-run leaves the per-turn checkpoints in the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from temporalio import activity
from temporalio.client import Client
from temporalio.service import RPCError

from activities._support import (
    application_error,
    heartbeat_interval,
    heartbeating,
    phase_network,
    typed_errors,
)
from proxy.errors import InvalidRequest
from proxy.replay import ReplayRecord
from proxy.trajectory import Counters, Trajectory
from trialflow.admission import Admission
from trialflow.errors import (
    InvalidSampling,
    ModelNotConfigured,
    ReplicaUnavailable,
    SandboxLost,
    UnsupportedFeature,
)
from trialflow.metrics import TrialMetrics
from trialflow.sandbox.base import Sandbox, SandboxBackend
from trialflow.sandbox.egress import Egresses
from trialflow.sandbox.network import network_policy
from trialflow.scaffolds import Scaffold, ScaffoldContext, ScaffoldResult, check_scaffold
from trialflow.scaffolds.base import mcp_problem, skills_problem
from trialflow.storage import ResultStore, StoreCheckpointSink, TrialKeys, load_attempt
from trialflow.tasks import load_task
from workflows.shared import (
    ScaffoldHeartbeat,
    ScaffoldInput,
    ScaffoldOutput,
    Termination,
    TrialError,
)

if TYPE_CHECKING:  # the proxy stack is optional: model-free workers never load it
    from proxy.server import ProxyServer, SessionHandle
    from proxy.session import SessionStats

log = logging.getLogger(__name__)

PROGRESS_SIGNAL = "report_progress"
# What a scaffold activity keeps of its start-to-close timeout beyond the agent's own time
# (closing the session, storing trajectory and logs): the model-phase wait gets the rest.
_AFTER_AGENT_S = 90.0


@contextlib.asynccontextmanager
async def _scope() -> AsyncIterator[tuple[str, contextlib.AsyncExitStack]]:
    """The activity's scope: typed errors, a temporary log dir, and a stack for what the
    activity holds until it ends (its admission unit, released before the dir goes)."""
    with typed_errors(), tempfile.TemporaryDirectory(prefix="tf-scaffold-") as tmp:
        async with contextlib.AsyncExitStack() as stack:
            yield tmp, stack


def _model_wait_s(inp: ScaffoldInput, started: float) -> float:
    """How long this activity may wait for a model-phase unit: what its start-to-close
    timeout leaves after the agent's time and `_AFTER_AGENT_S` (0 without a timeout)."""
    timeout = activity.info().start_to_close_timeout
    if timeout is None:
        return 0.0
    spent = time.monotonic() - started
    return timeout.total_seconds() - spent - inp.agent_timeout_s - _AFTER_AGENT_S


class ScaffoldActivities:
    """`proxy` None: this worker has no model; only `needs_model=False` scaffolds run.
    `client` (optional) signals live progress to the workflow. `admission` (optional): a
    scaffold with a model session holds a unit of its model-phase gate while it runs."""

    def __init__(
        self,
        proxy: ProxyServer | None,
        backend: SandboxBackend,
        store: ResultStore,
        metrics: TrialMetrics,
        client: Client | None = None,
        default_model: str | None = None,
        egresses: Egresses | None = None,
        admission: Admission | None = None,
    ) -> None:
        self._admission = admission
        self._egresses = egresses if egresses is not None else Egresses()
        self._proxy = proxy
        self._backend = backend
        self._store = store
        self._metrics = metrics
        self._client = client
        self._default_model = default_model

    @activity.defn(name="trial.run_scaffold")
    async def run_scaffold(self, inp: ScaffoldInput) -> ScaffoldOutput:
        started = time.monotonic()
        # Heartbeat from the first line: under load, loading the task and attaching to the
        # sandbox (a Docker call) can outlast the heartbeat timeout before `_beat` starts.
        async with _scope() as (tmp, admitted):
            async with heartbeating(interval_s=heartbeat_interval()):
                task = load_task(inp.task_path)
                # A step runs as its own session, under the step's keys (TrialKeys.step).
                step_key = task.step(inp.step).key if inp.step is not None else None
                keys = TrialKeys(inp.batch_id, inp.trial_id, inp.attempt, step_key)
                if inp.step is not None:
                    task = task.step_view(inp.step)
                scaffold = check_scaffold(inp.scaffold, inp.scaffold_options)
                skills = skills_problem(scaffold, task.config.environment.skills_dir)
                mcp = mcp_problem(scaffold, task.config.environment.mcp_servers)
                if skills is not None or mcp is not None:  # `run` refuses before submitting; others may not
                    raise UnsupportedFeature(str(task.path), [p for p in (skills, mcp) if p is not None])
                sandbox = await self._backend.attach(inp.sandbox_id)
                if scaffold.needs_model and self._admission is not None:
                    # queued for the model phase here, heartbeating: never a lost host
                    await admitted.enter_async_context(
                        self._admission.model_phase(_model_wait_s(inp, started))
                    )
            model = inp.model or self._default_model
            replay = None
            if scaffold.needs_model and inp.replay_from is not None:
                async with heartbeating(interval_s=heartbeat_interval()):
                    replay = await asyncio.to_thread(self._replay_record, inp)
            session = self._open_session(inp, keys, model, scaffold, replay) if scaffold.needs_model else None
            urls: tuple[str | None, str | None] = (None, None)
            if session is not None:
                try:
                    urls = await self._session_urls(session, sandbox, scaffold.runs_in_sandbox)
                except BaseException:
                    assert self._proxy is not None
                    await self._proxy.close_session(session.session_id)
                    raise
            live = _LiveBeat(inp.attempt, self._proxy, session.session_id if session else None)
            ctx = ScaffoldContext(
                sandbox=sandbox,
                task=task,
                anthropic_base_url=urls[0],
                openai_base_url=urls[1],
                model=model if session else None,
                timeout_s=inp.agent_timeout_s,
                heartbeat=live.from_scaffold,
                log_dir=Path(tmp),
                env=await self._egresses.env_for(
                    sandbox, network_policy(task, "agent", phase_network(inp.network, "agent"))
                ),
            )
            beats = asyncio.create_task(self._beat(live))
            trajectory: Trajectory | None = None
            trajectory_uri: str | None = None
            replicas_down = False
            agent_started = time.monotonic()
            try:
                try:
                    outcome = await scaffold.run(ctx)
                except SandboxLost as lost:
                    outcome = await _stopped_by_agent(sandbox, lost, time.monotonic() - agent_started)
                if session is not None and outcome.exit_code != 0 and not self._turn_limited(session):
                    replicas_down = await self._replicas_down(session.session_id)
            finally:
                beats.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await beats
                if session is not None:
                    # Also on failure and cancellation: the tokens so far are kept.
                    assert self._proxy is not None
                    async with heartbeating(interval_s=heartbeat_interval()):
                        trajectory = await self._proxy.close_session(session.session_id)
                        trajectory_uri = await asyncio.to_thread(
                            self._store.put_bytes, keys.trajectory, trajectory.to_bytes()
                        )
            async with heartbeating(interval_s=heartbeat_interval()):
                logs_uri = await self._store_logs(keys, outcome, Path(tmp))
        cause = infra_cause(trajectory.counters if trajectory else None, outcome.timed_out, replicas_down)
        if cause is not None:
            # The agent met infrastructure, not a task: this attempt says nothing about the model.
            raise application_error(ReplicaUnavailable(f"{inp.trial_id} attempt {inp.attempt}: {cause}"))
        for turn in trajectory.turns if trajectory else ():
            self._metrics.proxy_turn_seconds.observe(turn.latency_s)
        seconds = time.monotonic() - started
        self._metrics.phase_seconds.labels("scaffold").observe(seconds)
        overlong = trajectory is not None and trajectory.counters.overlong > 0
        turn_limited = trajectory is not None and trajectory.counters.turn_limited > 0
        termination, error = outcome_of(outcome, inp.attempt, overlong, turn_limited)
        counts = token_counts(trajectory)
        replay_status = trajectory.metadata.get("replay") if trajectory else None
        return ScaffoldOutput(
            termination_reason=termination,
            turns=trajectory.counters.turns if trajectory else 0,
            replayed_turns=trajectory.counters.replayed if trajectory else 0,
            replay_divergence=replay_status.get("divergence") if replay_status else None,
            tool_calls=trajectory.counters.tool_calls if trajectory else 0,
            rewrites_client=trajectory.counters.rewrites_client if trajectory else 0,
            rewrites_template=trajectory.counters.rewrites_template if trajectory else 0,
            prompt_tokens=counts[0],
            response_tokens=counts[1],
            trajectory_uri=trajectory_uri,
            logs_uri=logs_uri,
            error=error,
            seconds=seconds,
        )

    async def _session_urls(
        self, session: SessionHandle, sandbox: Sandbox, in_sandbox: bool
    ) -> tuple[str, str]:
        """(Anthropic, OpenAI) base URLs for the agent. An agent in the sandbox gets the
        session served on a listener inside the sandbox's network namespace (its only
        endpoint; no id or secret in the URL); one on the host gets the proxy's own URLs."""
        if not in_sandbox:
            return session.anthropic_base_url, session.openai_base_url
        assert self._proxy is not None
        base = await self._proxy.serve_session(session.session_id, await sandbox.listen_loopback())
        return base, f"{base}/v1"

    def _turn_limited(self, session: SessionHandle) -> bool:
        """Whether the session refused a turn at its turn limit (the agent stopped on that,
        not on a missing model)."""
        assert self._proxy is not None
        return self._proxy.session_stats(session.session_id).counters["turn_limited"] > 0

    async def _replicas_down(self, session_id: str) -> bool:
        """True when no replica of the session's pool answers a fresh health probe."""
        assert self._proxy is not None
        pool = self._proxy.session(session_id).pool
        await pool.check_health()
        return not any(replica.up for replica in pool.replicas)

    def _replay_record(self, inp: ScaffoldInput) -> ReplayRecord | None:
        """The replayable turns `inp.replay_from` left in the store (blocking), or None when it
        recorded nothing. An unreadable record is logged and ignored: the attempt then runs
        live, which costs replica time but never correctness."""
        assert inp.replay_from is not None
        loaded = load_attempt(self._store, inp.replay_from)
        if loaded.trajectory is None:
            if loaded.error:
                log.warning(
                    "%s: nothing to replay from attempt %d: %s",
                    inp.trial_id,
                    loaded.record.attempt,
                    loaded.error,
                )
            return None
        record = ReplayRecord.from_trajectory(loaded.trajectory)
        log.info(
            "%s attempt %d: replaying up to %d recorded turns of attempt %d (%s)",
            inp.trial_id,
            inp.attempt,
            len(record.turns),
            loaded.record.attempt,
            loaded.source,
        )
        return record

    def _open_session(
        self,
        inp: ScaffoldInput,
        keys: TrialKeys,
        model: str | None,
        scaffold: Scaffold,
        replay: ReplayRecord | None = None,
    ) -> SessionHandle:
        if self._proxy is None:
            raise ModelNotConfigured(
                f"scaffold {inp.scaffold} needs a model but this worker has no proxy "
                "(configure replica URLs and a model dir)"
            )
        # The spec's sampling was validated when it was made (workflows.shared.Sampling).
        config = self._proxy.defaults
        budget = inp.max_context_tokens is not None or inp.max_response_tokens is not None
        config = replace(
            config,
            # the trainer's token budget: the smaller bound wins; a trial with one ends at its
            # first overlong turn (proxy.session)
            max_context_tokens=_smaller(inp.max_context_tokens, config.max_context_tokens),
            max_response_tokens=_smaller(inp.max_response_tokens, config.max_response_tokens),
            overlong_ends_session=budget or config.overlong_ends_session,
            # an attempt that saw infrastructure is retried (infra_cause): fail the rest at once
            infra_ends_session=True,
            model=model or config.model,
            sampling=replace(config.sampling, **inp.sampling.overrides()),
            replicas=tuple(inp.replicas or config.replicas),
            checkpoint=StoreCheckpointSink(self._store, keys.checkpoints),
            metadata={"trial_id": inp.trial_id, "attempt": inp.attempt},
            main_thread=scaffold.main_thread,
            max_turns=scaffold.session_max_turns(),
            # What the replicas serve now, when the trainer's weight sync told this proxy
            # (trialflow.policy_sync); else the version the spec derived from its step.
            policy_version=inp.policy_version if config.policy_version is None else config.policy_version,
            # every attempt of the trial derives the same ids (proxy.ids)
            id_seed=inp.trial_id,
            replay=replay,
        )
        try:
            return self._proxy.open_session(config)
        except InvalidRequest as err:  # bad sampling values or replica urls: no retry can fix them
            raise InvalidSampling(f"bad session settings: {err.message}") from err

    async def _store_logs(self, keys: TrialKeys, outcome: ScaffoldResult, log_dir: Path) -> str:
        uri = await asyncio.to_thread(self._store.put_bytes, keys.log("scaffold.log"), outcome.log.encode())
        files = await asyncio.to_thread(lambda: sorted(p for p in log_dir.rglob("*") if p.is_file()))
        for path in files:
            name = f"scaffold/{path.relative_to(log_dir)}"
            await asyncio.to_thread(self._store.put_bytes, keys.log(name), path.read_bytes())
        return uri

    async def _beat(self, live: _LiveBeat) -> None:
        """Heartbeat the live counters; signal them to the workflow when they change."""
        last: ScaffoldHeartbeat | None = None
        interval = heartbeat_interval()
        info = activity.info()
        while True:
            beat = live.beat()
            activity.heartbeat(beat)
            counters = beat.model_copy(update={"scaffold": {}})  # the scaffold's details are not signalled
            if self._client is not None and counters != last:
                try:
                    assert info.workflow_id is not None  # always set for a workflow's activity
                    handle = self._client.get_workflow_handle(info.workflow_id, run_id=info.workflow_run_id)
                    await handle.signal(PROGRESS_SIGNAL, counters)
                    last = counters
                except RPCError as err:  # progress is advisory: never fail the trial for it
                    log.warning("progress signal for %s failed: %s", info.workflow_id, err)
            await asyncio.sleep(interval)


class _LiveBeat:
    """The attempt's live heartbeat: the proxy session's counters plus the latest details
    the scaffold reported through `ScaffoldContext.heartbeat`."""

    def __init__(self, attempt: int, proxy: ProxyServer | None, session_id: str | None) -> None:
        self._attempt, self._proxy, self._session_id = attempt, proxy, session_id
        self._details: dict[str, Any] = {}

    def beat(self) -> ScaffoldHeartbeat:
        beat = ScaffoldHeartbeat(attempt=self._attempt, scaffold=dict(self._details))
        if self._session_id is not None and self._proxy is not None:
            beat = beat.model_copy(update=live_counts(self._proxy.session_stats(self._session_id)))
        return beat

    def from_scaffold(self, details: dict[str, Any]) -> None:
        """`ScaffoldContext.heartbeat`: never blocks, never raises into the scaffold."""
        self._details = dict(details)
        try:
            activity.heartbeat(self.beat())
        except Exception as err:  # noqa: BLE001 - e.g. called outside the activity's context
            log.debug("scaffold heartbeat not sent: %s", err)


def infra_cause(counters: Counters | None, timed_out: bool, replicas_down: bool) -> str | None:
    """Why an attempt's outcome is infrastructure's, not the agent's (module docstring), or
    None. ``counters``: the session's (None: no session); ``replicas_down``: the agent failed
    while no replica of its pool answered a health probe."""
    if counters is not None and counters.infra_errors:
        n = counters.infra_errors
        return (
            f"the agent saw {n} infrastructure error{'s' if n != 1 else ''} (no replica could serve its turn)"
        )
    if counters is not None and timed_out and counters.outage_holds:
        n = counters.outage_holds
        return f"the agent timed out in an attempt whose turns waited for a replica ({n} held)"
    if replicas_down:
        return "the agent failed while no replica answered"
    return None


def _smaller(a: int | None, b: int | None) -> int | None:
    """The smaller of two optional bounds (None: no bound)."""
    return b if a is None else a if b is None else min(a, b)


async def _stopped_by_agent(sandbox: Sandbox, lost: SandboxLost, seconds: float) -> ScaffoldResult:
    """The agent's outcome when its sandbox stopped under it but is still there (it killed
    the keep-alive, or its processes outgrew the task's memory limit): nothing outside the
    sandbox stopped it, so the attempt is verified from the files it left (the verification
    restart starts it again), never retried as an infrastructure failure a failing agent
    could use to escape its reward. Re-raises `lost` when the sandbox is gone or the engine
    does not answer (not the agent's doing)."""
    try:
        running = await sandbox.is_running()
    except SandboxLost:
        raise lost from None
    if running:
        raise lost
    log.info("sandbox %s stopped during the agent phase: the agent's outcome (%s)", sandbox.id, lost)
    return ScaffoldResult(
        exit_code=137,
        timed_out=False,
        stdout="",
        stderr=f"[trialflow: {lost}]",
        duration_s=seconds,
        detail="the sandbox stopped during the agent phase (its keep-alive ended); verified from its files",
    )


def live_counts(stats: SessionStats) -> dict[str, int]:
    """Heartbeat fields from the proxy's live session stats."""
    return {
        "turns": stats.turns,
        "prompt_tokens": stats.prompt_tokens,
        "response_tokens": stats.completion_tokens,
    }


def token_counts(trajectory: Trajectory | None) -> tuple[int, int]:
    """(prompt tokens, generated tokens) summed over the turns a replica generated: every such
    turn's whole prompt counts, so this is the work the replicas did (turns replayed from a
    lost attempt's record cost none and are not counted)."""
    if trajectory is None:
        return 0, 0
    live = [turn for turn in trajectory.turns if turn.source == "generated"]
    return sum(t.prompt_tokens for t in live), sum(t.completion_tokens for t in live)


def outcome_of(
    outcome: ScaffoldResult, attempt: int, overlong: bool = False, turn_limited: bool = False
) -> tuple[Termination, TrialError | None]:
    """Map a ScaffoldResult onto the trial's termination reason and error data.

    A timeout wins over everything; a run whose conversation outgrew the context (the
    proxy refused a turn) is "overlong" whatever the agent's exit code; a scaffold that
    reports its own turn limit (`stop_reason` "max_turns", exit code non-zero), or whose
    proxy session refused a turn at the session's turn limit (`turn_limited`: the CLI then
    fails on that 400), is "max_turns" with no error: the agent ran out of turns, it did
    not crash. A `scaffold_error` message carries the scaffold's `detail`, then its last 3
    stderr lines."""
    if outcome.timed_out:
        return "timeout", None
    if overlong:
        return "overlong", None
    if outcome.stop_reason == "max_turns" or turn_limited:
        return "max_turns", None
    if outcome.exit_code != 0:
        said = ([outcome.detail.strip()] if outcome.detail else []) + outcome.stderr.strip().splitlines()[-3:]
        return "scaffold_error", TrialError(
            type="ScaffoldExit",
            message=f"scaffold exited with code {outcome.exit_code}"
            + (f": {' | '.join(said)}" if said else ""),
            phase="scaffold",
            attempt=attempt,
        )
    return "submitted", None
