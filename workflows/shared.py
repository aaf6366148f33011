"""Types and names shared by the trial workflow, its activities, the worker and clients.

Side-effect free: no I/O, no clients, nothing started at import. Every workflow and
activity takes ONE pydantic input object and returns one, so fields can be added
later without breaking recorded histories (new fields need defaults).

Identity and layout rules (pure functions, used by the workflow AND by clients):

- workflow id: ``trial-{batch_id}-{task_name}-{sample_index}`` (`trial_id`; `task_name` is unique
  within a batch: `trialflow.batch.task_labels`, and `batch.submit` refuses clashing ids); the n-th rerun
  of a failed trial (`trialflow replay BATCH --failed`) gets ``{that id}-r{n}`` and names the original in `TrialSpec.replay_of`
  (also in the workflow memo).
- shared task queue: `SHARED_QUEUE` (workflows, result storage, teardown fallback: any
  worker); sandbox set-up on ``{shared}-setup`` (`setup_queue`), also any worker.
- host task queue: ``trialflow-host-{hostname}-{worker_id}`` (`host_queue`): every activity
  that touches a sandbox after set-up runs on the worker that owns the sandbox.
- store layout: `trialflow.storage.TrialKeys` (``batches/{batch}/trials/{trial}/attempt-{n}/``
  with ``checkpoints/``, ``trajectory.npz``, ``logs/``); the final `TrialResult` of the whole
  trial is ``batches/{batch}/trials/{trial}/result.json``. The workflow never builds keys:
  activities return URIs.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

SHARED_QUEUE = "trialflow-shared"
# An attempt's per-turn checkpoints live under this folder of its store root (trialflow.storage.TrialKeys).
CHECKPOINTS_DIR = "checkpoints"
WORKFLOW_NAME = "TrialWorkflow"

Termination = Literal[
    "submitted",  # the scaffold finished on its own
    "timeout",  # the task's agent timeout ran out; verified anyway
    "scaffold_error",  # the scaffold crashed (its own fault, not infrastructure)
    "infra_error",  # sandbox/proxy/worker failures outlived every retry and attempt
    "verifier_error",  # the verifier crashed or gave no valid reward (or failed to run at all)
    "setup_error",  # the task could not be set up: bad task dir/config, image build, entrypoint, healthcheck
    "overlong",  # the conversation outgrew the model's context
    "max_turns",  # the scaffold stopped at its own turn limit; verified anyway
    "cancelled",  # the workflow was cancelled
]
# "step_setup": a multi-step task's per-step preparation (workdir, setup.sh, step healthcheck)
# Who ran test.sh, and so what a reward can be trusted for (docs/design.md, "Reward integrity"):
# "harness": in the agent's sandbox (shared mode) after the verification restart, with the
# harness's own toolchain: nothing the agent left runs, but test.sh's interpreters are the
# image's, which the agent could have replaced; "separate": a fresh verifier sandbox that
# received only the task's artifacts.
VerifierTrust = Literal["harness", "separate"]
TrialOutcome = Literal["ok", "invalid", "error"]  # the SA_OUTCOME values
Phase = Literal["pending", "setup", "step_setup", "scaffold", "verify", "teardown", "done"]

# Search attributes: name -> Temporal type (registered by `trialflow.batch.ensure_search_attributes`,
# and by `infra.services.start_temporal` at server start). The one table of them.
SA_BATCH = "TrialBatchId"
SA_TASK = "TrialTask"
SA_SCAFFOLD = "TrialScaffold"
SA_REWARD = "TrialReward"
SA_TERMINATION = "TrialTermination"
SA_STEP = "TrialStep"
SA_REWARD_VALID = "TrialRewardValid"  # "true" / "false": an invalid reward is not a 0
# "ok" / "invalid" (no valid reward) / "error" (ended by an error): TrialOutcome, set at the end
# (trialflow.trial_details.outcome), so a batch's trials that need a look are one query
SA_OUTCOME = "TrialOutcome"
SEARCH_ATTRIBUTE_TYPES: dict[str, str] = {
    SA_BATCH: "keyword",
    SA_TASK: "keyword",
    SA_SCAFFOLD: "keyword",
    SA_REWARD: "double",
    SA_TERMINATION: "keyword",
    SA_STEP: "int",
    SA_REWARD_VALID: "keyword",
    SA_OUTCOME: "keyword",
}

_UNSAFE_ID_CHARS = re.compile(r"[^A-Za-z0-9_.-]+")


def safe_id_part(text: str) -> str:
    """Make `text` safe inside a workflow id / S3 key: runs of other characters become '_'."""
    return _UNSAFE_ID_CHARS.sub("_", text).strip("_") or "_"


def trial_id(batch_id: str, task_name: str, sample_index: int) -> str:
    """Deterministic workflow id, so a re-submitted batch attaches to existing trials."""
    return f"trial-{safe_id_part(batch_id)}-{safe_id_part(task_name)}-{sample_index}"


def setup_queue(shared_queue: str) -> str:
    """Queue of the set-up activity, apart from the shared queue so that a draining
    worker can stop taking sandboxes while it still stores results and runs workflows."""
    return f"{shared_queue}-setup"


def host_queue(hostname: str, worker_id: str) -> str:
    """Task queue of one worker process; sandboxes it created are only reachable there."""
    return f"trialflow-host-{safe_id_part(hostname)}-{safe_id_part(worker_id)}"


class Sampling(BaseModel):
    """A trial's sampling settings for every turn of its proxy session; a field left None
    keeps the session default (`proxy.chat.SamplingParams`). Validated when the spec is
    made, so a typo (unknown field) or a wrong type fails before anything is submitted or
    built. `max_tokens` caps each turn beside the client's own cap (the smaller wins)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = None  # -1: off
    stop: list[Annotated[str, Field(min_length=1)]] | None = None
    seed: int | None = None

    def overrides(self) -> dict[str, Any]:
        """The fields set, as `SamplingParams` keyword arguments (`stop` a tuple)."""
        out = self.model_dump(exclude_none=True)
        if "stop" in out:
            out["stop"] = tuple(out["stop"])
        return out


# A mode a run may choose for a phase (an allowlist needs the task's hosts).
RunNetworkMode = Literal["no-network", "public"]


class RunNetwork(BaseModel):
    """The run's say in each phase's network (`trialflow.sandbox.network.resolve_network`):
    `agent_default` / `verifier_default` where a task states no network baseline (agent
    no-network, for training; verifier public, Harbor's default), `agent` / `verifier` a mode
    forced whatever the task states (None: the task decides), `agent_hosts` / `verifier_hosts`
    merged into the phase's allowlist (Harbor's `--allow-agent-host` / `--allow-verifier-host`;
    normalised by the settings). Settings `agent_network`, `agent_network_default`,
    `agent_allowed_hosts` and the verifier's."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    agent: RunNetworkMode | None = None
    agent_default: RunNetworkMode = "no-network"
    verifier: RunNetworkMode | None = None
    verifier_default: RunNetworkMode = "public"
    agent_hosts: tuple[str, ...] = ()
    verifier_hosts: tuple[str, ...] = ()


class TrialSpec(BaseModel):
    """Everything one trial needs. The workflow input.

    `attempt_limit` bounds how often the workflow starts over with a NEW sandbox after
    a lost host (each activity also has its own Temporal retry policy). If
    `agent_timeout_s` is None the task's own agent timeout applies. `replicas` None
    means the worker's configured replica pool. `scaffold` is a registered name or an
    import path ``"my_pkg.my_mod:MyScaffold"`` (importable on the workers);
    `scaffold_options` go to its constructor (e.g. ``{"max_turns": 20}``; see each scaffold).

    Token budget of the trainer (None: none; verl's loop sets both): `max_context_tokens` bounds
    one trained sequence (a proxy segment: prompt + every later token, verl's
    ``rollout.prompt_length + rollout.response_length``), `max_response_tokens` the tokens after
    a segment's first prompt (``rollout.response_length``). The proxy session caps each turn's
    ``max_tokens`` so the sequence stays within both, refuses a turn whose prompt alone leaves
    no room, and with either set ends the agent's turns at the first overlong turn: the trial
    ends "overlong" and is verified as the agent left it then (`proxy.session` docstring).
    """

    batch_id: str
    task_path: str
    task_name: str
    scaffold: str
    scaffold_options: dict[str, Any] = Field(default_factory=dict)
    sample_index: int = 0
    attempt_limit: int = 3
    agent_timeout_s: float | None = None
    model: str | None = None
    sampling: Sampling = Field(default_factory=Sampling)
    replicas: list[str] | None = None
    max_context_tokens: int | None = Field(None, ge=1)
    max_response_tokens: int | None = Field(None, ge=1)
    step: int | None = None  # RL step (verl); becomes the TrialStep search attribute
    # The weights version the replicas serve for this trial (verl: `SampleIdentity.policy_version`),
    # recorded in the trajectory unless the worker's proxy heard a newer weight sync.
    policy_version: int | None = None
    # A rerun of a failed trial (`replay --failed`; the field names predate the word):
    replay_of: str | None = None  # original workflow id when this is a rerun
    replay: int = 0  # n-th rerun of that trial (0: the original)
    # How fast a lost worker is noticed: heartbeat silence, and how long an activity may
    # wait on a host queue that nobody polls any more.
    heartbeat_timeout_s: float = 30.0
    host_schedule_timeout_s: float = 120.0
    metadata: dict[str, str] = Field(default_factory=dict)
    network: RunNetwork = Field(default_factory=RunNetwork)  # each phase's network: RunNetwork
    # The trajectory viewer's address the Temporal UI's details link the trial to
    # (trialflow.trial_details.viewer_link); None: its default address
    viewer_url: str | None = None

    @property
    def trial_id(self) -> str:
        """The workflow id; a rerun gets its own (``...-r{n}``) so nothing is overwritten."""
        base = trial_id(self.batch_id, self.task_name, self.sample_index)
        return f"{base}-r{self.replay}" if self.replay else base


class TrialError(BaseModel):
    """A failure kept as data: error type name (trialflow.errors), message, phase, retryable."""

    type: str
    message: str
    phase: Phase
    non_retryable: bool = False
    attempt: int = 0


class AttemptRecord(BaseModel):
    """Where one trial attempt's trajectory is. Built by the workflow from the URIs its
    activities return; kept in `TrialResult.attempt_records`, one per attempt that got a
    sandbox, oldest first.

    - ``checkpoints_uri``: the prefix of its per-turn checkpoints (ends with ``/``).
    - ``trajectory_uri``: its final trajectory; None while it runs, when it was lost, or
      when its scaffold had no model session (oracle, nop).
    - ``complete``: the scaffold phase reported back. False: the attempt was lost (its
      worker died or its heartbeat stopped), and its checkpoints are all there is.
    """

    model_config = ConfigDict(frozen=True)

    attempt: int
    checkpoints_uri: str
    trajectory_uri: str | None = None
    complete: bool = False
    # The attempt was declared lost with its host and fenced (trialflow.fencing): nothing it
    # wrote after that was kept; `host_queue` is the host it was lost on.
    fenced: bool = False
    host_queue: str | None = None

    @classmethod
    def begun(cls, attempt: int, attempt_uri: str) -> AttemptRecord:
        """The record of an attempt whose sandbox is up (``attempt_uri``: the store URI of
        `TrialKeys.root`, as the set-up activity returns it)."""
        return cls(attempt=attempt, checkpoints_uri=f"{attempt_uri.rstrip('/')}/{CHECKPOINTS_DIR}/")

    def finished(self, trajectory_uri: str | None) -> AttemptRecord:
        """The same attempt once its scaffold phase reported (``trajectory_uri`` None: no session)."""
        return self.model_copy(update={"trajectory_uri": trajectory_uri, "complete": True})

    @property
    def uri(self) -> str | None:
        """The one URI that names its trajectory: the final one, else (a lost attempt) the
        checkpoint prefix; None for a model-free attempt."""
        if self.trajectory_uri is not None:
            return self.trajectory_uri
        return None if self.complete else self.checkpoints_uri


class TrialCounters(BaseModel):
    """The counters of a scaffold run, defined once for `ScaffoldOutput` (one attempt's or
    step's run), `StepResult` (one step) and `TrialResult` (the trial: its finishing attempt's,
    summed over a multi-step task's steps).

    Inherited as flat fields, not nested: each model's JSON keeps the keys it always had, so
    recorded histories and stored results load, and readers keep reading the same keys. A JSON
    without a counter (a `StepResult` from before it had `tool_calls`, ...) loads it as 0.
    `counters()` copies them from one model into another; `summed` adds several up."""

    turns: int = 0
    # Of `turns`: answered from a lost attempt's record (`ScaffoldInput.replay_from`, no
    # replica called); the rest were generated by a replica.
    replayed_turns: int = 0
    tool_calls: int = 0
    prompt_tokens: int = 0
    response_tokens: int = 0
    # New segments the scaffold forced by rewriting its history vs ones the chat template forced
    # (proxy.trajectory.Counters); verl's rewritten_segments="drop" discards both kinds.
    rewrites_client: int = 0
    rewrites_template: int = 0

    def counters(self) -> dict[str, Any]:
        """The counters by field name, to build another model with: `StepResult(**out.counters(), ...)`."""
        return {name: getattr(self, name) for name in TrialCounters.model_fields}

    @staticmethod
    def summed(parts: Iterable[TrialCounters]) -> dict[str, Any]:
        """Each counter added up over `parts` (all 0 for none), in `counters()`'s form."""
        total = dict.fromkeys(TrialCounters.model_fields, 0)
        for part in parts:
            for name, value in part.counters().items():
                total[name] += value
        return total


class StepResult(TrialCounters):
    """One step of a multi-step task (`[[steps]]`) as it ran, in `TrialResult.step_results`.

    Rewards as the step's verifier wrote them (`reward_valid` False: none, `reward_error`
    says why). `termination_reason` is the step's agent outcome (None: the agent never ran,
    its set-up failed: `error`). `stopped` says why the sequence ended after this step (a
    failed set-up, no valid reward, or the `min_reward` gate; None: it went on, or it was
    the last). `trajectory_uri`: the step's own proxy session (None for model-free scaffolds).
    """

    name: str
    rewards: dict[str, float] = Field(default_factory=dict)
    reward: float = 0.0
    reward_valid: bool = False
    reward_error: str | None = None
    termination_reason: Termination | None = None
    error: TrialError | None = None
    stopped: str | None = None
    trajectory_uri: str | None = None
    logs_uri: str | None = None
    timings: dict[str, float] = Field(default_factory=dict)
    verifier_trust: VerifierTrust | None = None
    # The step's own phases' network (a step may override the task's): as TrialResult's.
    network_modes: dict[str, str] = Field(default_factory=dict)
    network_origins: dict[str, str] = Field(default_factory=dict)


class TrialResult(TrialCounters):
    """The small, final record of a trial. Big things live in the store (URIs here).

    The counters (`TrialCounters`) are the finishing attempt's; `generated_turns` is
    `turns - replayed_turns`. A multi-step task's result holds one `StepResult` per step that
    ran (`step_results`, in order) and its `rewards` are those steps' combined by
    `multi_step_reward_strategy` (trialflow.multi_step); the counters are summed over the steps."""

    trial_id: str
    batch_id: str
    task_name: str
    scaffold: str
    sample_index: int
    rewards: dict[str, float] = Field(default_factory=dict)
    reward: float = 0.0
    reward_valid: bool = False
    reward_error: str | None = None
    termination_reason: Termination
    # The sandbox's network mode (trialflow.sandbox.network): one mode, or "agent X, verifier Y".
    network_mode: str = "no-network"
    # Each phase's effective mode, by phase ("agent", "verifier"), and where it came from:
    # "task" (the task states it), "default" (the run's default: the task states none), "run"
    # (forced by the run). Empty: a result recorded before these fields.
    network_modes: dict[str, str] = Field(default_factory=dict)
    network_origins: dict[str, str] = Field(default_factory=dict)
    # Where test.sh ran (VERIFIER_TRUST); None: not verified. A multi-step trial: the weakest
    # of its steps' ("harness" if any step was verified in the agent's sandbox).
    verifier_trust: VerifierTrust | None = None
    # Of the finishing attempt's turns: generated by a replica. turns == replayed_turns + generated_turns.
    generated_turns: int = 0
    timings: dict[str, float] = Field(default_factory=dict)  # phase -> seconds (summed over attempts)
    attempts: int = 0
    # one per attempt that got a sandbox, oldest first (`trialflow.storage.load_attempt` reads them)
    attempt_records: list[AttemptRecord] = Field(default_factory=list)
    logs_uri: str | None = None
    result_uri: str | None = None
    error: TrialError | None = None
    step_results: list[StepResult] = Field(default_factory=list)  # empty: a single-step task
    multi_step_reward_strategy: str | None = None  # the task's, as written (None: "mean")

    @classmethod
    def of(cls, spec: TrialSpec, **fields: Any) -> TrialResult:
        """The result of `spec`'s trial: its identity fields (trial id, batch, task, scaffold,
        sample) from the spec, everything else from `fields`."""
        return cls(
            trial_id=spec.trial_id,
            batch_id=spec.batch_id,
            task_name=spec.task_name,
            scaffold=spec.scaffold,
            sample_index=spec.sample_index,
            **fields,
        )

    @property
    def failed(self) -> bool:
        """True when the trial ended by an error rather than an agent outcome."""
        return self.error is not None

    @property
    def trajectory_uris(self) -> list[str]:
        """Each attempt's trajectory URI (`AttemptRecord.uri`: a lost attempt's checkpoint
        prefix), model-free attempts left out. For display; read trajectories with
        `trialflow.storage.load_attempt`."""
        return [r.uri for r in self.attempt_records if r.uri is not None]

    @property
    def last_attempt(self) -> AttemptRecord | None:
        """The record of the attempt whose outcome this result reports (None: no attempt got
        a sandbox)."""
        return self.attempt_records[-1] if self.attempt_records else None


class TrialProgress(BaseModel):
    """Live view returned by the workflow's `progress` query."""

    phase: Phase = "pending"
    attempt: int = 0
    turns: int = 0
    prompt_tokens: int = 0
    response_tokens: int = 0
    host_queue: str | None = None


# ---- activity inputs / outputs -------------------------------------------------------


class SetupInput(BaseModel):
    batch_id: str
    trial_id: str
    attempt: int
    task_path: str
    scaffold: str | None = None  # the scaffold may need host mounts in the sandbox
    scaffold_options: dict[str, Any] = Field(default_factory=dict)
    labels: dict[str, str] = Field(default_factory=dict)
    network: RunNetwork = Field(default_factory=RunNetwork)


class StepPlan(BaseModel):
    """What the workflow needs to run one `[[steps]]` entry (resolved at set-up)."""

    name: str
    index: int  # 1-based
    agent_timeout_s: float
    verifier_timeout_s: float
    min_reward: float | dict[str, float] | None = None
    network_modes: dict[str, str] = Field(default_factory=dict)  # as SetupOutput's, the step's own
    network_origins: dict[str, str] = Field(default_factory=dict)


class SetupOutput(BaseModel):
    """Where the sandbox lives: later activities go to `host_queue`. `steps` empty: a
    single-step task (the command sequence of such a trial is unchanged by steps)."""

    sandbox_id: str
    host_queue: str
    attempt_uri: str  # store URI of ``attempt_key(trial_id, attempt)``
    agent_timeout_s: float
    verifier_timeout_s: float
    seconds: float
    # trialflow.sandbox.network: "no-network" | "allowlist" | "public" (or the two phases').
    network_mode: str = "no-network"
    network_modes: dict[str, str] = Field(default_factory=dict)  # TrialResult.network_modes
    network_origins: dict[str, str] = Field(default_factory=dict)
    steps: list[StepPlan] = Field(default_factory=list)
    multi_step_reward_strategy: str | None = None
    # The Docker engine that holds the sandbox (its `docker info` ID): a fallback teardown on
    # another worker removes it only on the same engine (None: an output from before).
    engine_id: str | None = None


class PrepareStepInput(BaseModel):
    batch_id: str
    trial_id: str
    attempt: int
    sandbox_id: str
    task_path: str
    step: str


class PrepareStepOutput(BaseModel):
    """`error` set: the step's set-up failed (an outcome: the sequence stops there)."""

    error: TrialError | None = None
    seconds: float = 0.0


class ScaffoldInput(BaseModel):
    batch_id: str
    trial_id: str
    attempt: int
    sandbox_id: str
    task_path: str
    scaffold: str
    agent_timeout_s: float
    scaffold_options: dict[str, Any] = Field(default_factory=dict)
    model: str | None = None
    sampling: Sampling = Field(default_factory=Sampling)
    replicas: list[str] | None = None
    # `TrialSpec.policy_version`: the session's version when the worker's proxy knows none
    # from the trainer's broadcast (activities.scaffold).
    policy_version: int | None = None
    # `TrialSpec`'s token budget (None: none); the session's limits (activities.scaffold).
    max_context_tokens: int | None = None
    max_response_tokens: int | None = None
    # An earlier attempt of this trial (lost with its host) whose recorded turns the session
    # replays while the scaffold's requests match them (proxy.replay); None: all live.
    replay_from: AttemptRecord | None = None
    step: str | None = None  # a multi-step task's step: its instruction, solution, store keys
    network: RunNetwork = Field(default_factory=RunNetwork)


class ScaffoldOutput(TrialCounters):
    termination_reason: Termination
    # Where the replay stopped (proxy.replay.Divergence.summary()), None if it never did.
    replay_divergence: dict[str, Any] | None = None
    trajectory_uri: str | None = None
    logs_uri: str | None = None
    error: TrialError | None = None
    seconds: float = 0.0


class ScaffoldHeartbeat(BaseModel):
    """Heartbeat details of the scaffold activity, also signalled to the workflow (when the
    counters change). `scaffold` is the latest `ScaffoldContext.heartbeat` details the
    scaffold itself reported (heartbeat only, not signalled)."""

    attempt: int
    turns: int = 0
    prompt_tokens: int = 0
    response_tokens: int = 0
    scaffold: dict[str, Any] = Field(default_factory=dict)


class VerifyInput(BaseModel):
    batch_id: str
    trial_id: str
    attempt: int
    sandbox_id: str
    task_path: str
    verifier_timeout_s: float
    step: str | None = None  # a multi-step task's step: its tests, verifier settings, store keys
    network: RunNetwork = Field(default_factory=RunNetwork)


class VerifyOutput(BaseModel):
    rewards: dict[str, float] = Field(default_factory=dict)
    reward: float = 0.0
    reward_valid: bool = False
    reward_error: str | None = None
    seconds: float = 0.0
    # Who ran test.sh: VERIFIER_TRUST (None: an output recorded before the field existed).
    verifier_trust: VerifierTrust | None = None


class TeardownInput(BaseModel):
    batch_id: str
    trial_id: str
    attempt: int
    sandbox_id: str
    engine_id: str | None = None  # `SetupOutput.engine_id`: elsewhere nothing is removed


class TeardownOutput(BaseModel):
    """`removed`: the sandbox was removed by this call; False: it was absent here, or on
    another engine (`note` says which; left to its host's lease); None: an output from before."""

    seconds: float = 0.0
    removed: bool | None = None
    note: str = ""


class FenceInput(BaseModel):
    """`trial.fence_attempt`: the workflow declares `attempt` lost on `host_queue`."""

    batch_id: str
    trial_id: str
    attempt: int
    host_queue: str
    reason: str = ""


class FenceOutput(BaseModel):
    epoch: int  # the lowest attempt still allowed to write
    fence_uri: str


class StoreResultInput(BaseModel):
    result: TrialResult


class StoreResultOutput(BaseModel):
    result_uri: str
