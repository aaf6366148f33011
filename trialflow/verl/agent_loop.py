"""verl agent loop that runs each sample as a durable trial workflow on Temporal.

Select it through verl's agent-loop config (``actor_rollout_ref.rollout.agent.agent_loop_config_path``
pointing at a YAML list such as ``examples/verl/agent_loop.yaml``; each entry's ``_target_``
is instantiated by hydra with the entry's other keys as keyword arguments) and name it
per row (dataset column ``agent_name``) or as ``rollout.agent.default_agent_loop``.

Per sample, `TemporalAgentLoop.run`:
1. reads the task from the dataset row (`TrialRow`, under ``extra_info["trialflow"]``);
2. derives the trial's identity (`SampleIdentity`: step, row, rollout) and from it the
   workflow id ``trial-{run}-{train|val}-step{S}-{task}-{row * n + rollout}``. The same
   sample of the same step always maps to the same id, so a restarted trainer re-attaches
   to the running (or finished) workflow instead of starting the trial again;
3. asks verl's load balancer for the rollout servers' HTTP addresses (``replicas: verl``)
   and passes them in the `TrialSpec` (``replicas``: the proxy session's own pool) with the
   global step (``step``) and the weights version the replicas serve for it
   (`SampleIdentity.policy_version`; docs/verl.md);
4. runs it as a batch of one (`run_step`; ``trial_timeout_s`` cancels a straggler),
   reads the trajectory from the store and converts it (`convert.convert_trial`; a
   multi-step task: every step's trajectory, `convert.ConvertConfig.steps`).

Identity sources, first match wins:
- `TemporalAgentLoopManager` (``rollout.agent.agent_loop_manager_class``) stamps
  ``trialflow_step/row/rollout/rollouts/validate`` on every row of the batch: row = ordinal
  of the prompt group (consecutive equal ``uid``) in the step batch, rollout = position in
  the group. Needed with verl's classic ``AgentLoopWorker``, which passes no step to ``run``.
- verl's v1 TransferQueue worker passes ``global_steps``, ``index`` (``extra_info.index``,
  which must then be unique per row) and ``session_id`` (the rollout). It does not say
  whether the batch is a validation batch: give validation rows ``split: val`` in their
  `TrialRow` so their ids cannot meet a training row's.
- neither: `TrialIdentityError` (a random id would silently defeat re-attaching).

Returned value: one ``AgentLoopOutput`` (the primary sample), or, when the trial has
side/rewritten/step segments configured as ``"extra"`` (the default), the list
``[*extras, primary]``, which only verl's v1 worker accepts.

Trainers (`check_trainer`, at construction, before any trial runs):
- verl's v1 trainer (``trainer.use_v1=true``, verl 0.9.1's default; every
  ``trainer.v1.trainer_mode``): supported as is, no manager class to set. Every segment
  trains; invalid members spoil their group through `groups.GroupGate`.
- verl's classic trainer (``trainer.use_v1=false``) with `TemporalAgentLoopManager`: one
  sample per input row (``RayPPOTrainer.fit`` unions the generation output with the
  repeated input batch and slices it to the input's length), so ``"extra"`` segment
  policies are refused with what to change; groups are masked in the manager.
- verl's fully-async trainer (``async_training`` in the config): refused. Its rollouter
  hard-codes its own loop manager (no identity on the rows: every sample would raise
  `TrialIdentityError`) and its own checkpoint manager (no weight-sync announcement).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from omegaconf import DictConfig, OmegaConf
from pydantic import BaseModel, ConfigDict, Field
from temporalio.client import Client
from verl.experimental.agent_loop.agent_loop import (
    AgentLoopBase,
    AgentLoopManager,
    AgentLoopMetrics,
    AgentLoopOutput,
)
from verl.utils.ray_utils import auto_await

from trialflow.cluster import connect_temporal
from trialflow.settings import TrialflowSettings, load_settings
from trialflow.storage import ResultStore, open_store
from trialflow.verl.convert import (
    ConvertConfig,
    ConvertedTrial,
    LoopSample,
    convert_trial,
    extra_fields,
    loop_metrics,
)
from trialflow.verl.groups import GroupGate, GroupMember, InvalidGroupPolicy, groups_to_mask
from trialflow.verl.signal import step_metrics
from trialflow.verl.step_batch import StepTrial, StragglerPolicy, run_step
from workflows.shared import Sampling, TrialSpec

log = logging.getLogger(__name__)

STAMP_PREFIX = "trialflow_"
# Keywords verl itself adds when instantiating an agent loop (not ours to validate).
_VERL_KWARGS = {"name", "tools"}


class TrialIdentityError(ValueError):
    """The sample's step/row/rollout cannot be determined (see the module docstring)."""


class UnsupportedTrainer(ValueError):
    """The verl configuration cannot train what the trials produce (the message says what to change)."""


class ReplicaDiscoveryError(RuntimeError):
    """verl's rollout server addresses could not be read from the server manager."""


class TrialRow(BaseModel):
    """The task reference a dataset row carries under ``extra_info["trialflow"]``.

    Unset fields fall back to the agent-loop config. ``task_name`` None: the task
    directory's name.
    """

    model_config = ConfigDict(extra="forbid")

    task_path: str
    task_name: str | None = None
    split: str | None = None  # e.g. "train"/"val"; overrides the identity's validate flag in the id
    scaffold: str | None = None
    scaffold_options: dict[str, Any] | None = None  # None: the loop config's (when the scaffold is too)
    agent_timeout_s: float | None = None
    attempt_limit: int | None = None


class LoopConfig(BaseModel):
    """The agent-loop YAML entry's keys (besides ``name``/``_target_``), read once."""

    model_config = ConfigDict(extra="forbid")

    run_name: str | None = None  # None: trainer.experiment_name
    scaffold: str = "terminus"  # a registered name or "my_pkg.my_mod:MyScaffold"
    scaffold_options: dict[str, Any] = Field(default_factory=dict)  # the scaffold's constructor options
    model: str | None = None  # None: actor_rollout_ref.model.path (vLLM's default served name)
    replicas: Literal["verl", "worker"] | list[str] = "verl"  # "worker": the worker's own pool
    sampling: Sampling = Field(default_factory=Sampling)  # over verl's sampling params
    attempt_limit: int = 3
    agent_timeout_s: float | None = None
    # how fast a lost host is noticed (None: TrialSpec's defaults, 30 s / 120 s)
    heartbeat_timeout_s: float | None = None
    host_schedule_timeout_s: float | None = None
    trial_timeout_s: float | None = None  # None: wait as long as the trial runs
    cancel_wait_s: float = 30.0
    task_queue: str | None = None  # None: settings.task_queue
    # every segment the policy generated trains ("extra": a sample of its own, same group)
    side_segments: Literal["drop", "extra"] = "extra"
    rewritten_segments: Literal["drop", "extra"] = "extra"
    # a multi-step task: the later steps' own sequences ("extra": one more sample each)
    step_segments: Literal["drop", "extra"] = "extra"
    invalid_reward: float = 0.0
    mask_invalid: bool = True
    invalid_groups: InvalidGroupPolicy = "mask_group"  # trialflow.verl.groups
    overlong_filter: bool = False  # mask trials that ended at the token budget (DAPO)
    routed_experts: tuple[int, int] | None = None  # (layers, top_k) when router replay is on
    settings: dict[str, Any] = Field(default_factory=dict)  # TrialflowSettings overrides


def trainer_kind(config: Any) -> Literal["v1", "classic", "fully_async"]:
    """Which verl trainer drives the loop (``trainer.use_v1`` is verl 0.9.1's default)."""
    if config.get("async_training") is not None:
        return "fully_async"
    return "v1" if bool(config.get("trainer", {}).get("use_v1", True)) else "classic"


def check_trainer(config: Any, loop: LoopConfig) -> None:
    """Refuse, before any trial runs, a verl trainer that cannot train what ``loop`` makes."""
    kind = trainer_kind(config)
    if kind == "fully_async":
        raise UnsupportedTrainer(
            "verl's fully-async trainer (async_training) is not supported: its rollouter uses its own "
            "agent-loop manager, whose rows carry no step/rollout identity, and its own checkpoint "
            "manager, which announces no weight versions. Use verl's v1 trainer instead "
            "(trainer.use_v1=true, trainer.v1.trainer_mode=separate_async or colocate_async for "
            "asynchronous training)."
        )
    extra = [
        k for k in ("side_segments", "rewritten_segments", "step_segments") if getattr(loop, k) == "extra"
    ]
    if kind == "classic" and extra:
        raise UnsupportedTrainer(
            f"verl's classic trainer (trainer.use_v1=false) takes one sample per input row "
            f"(RayPPOTrainer.fit unions the rollout output with the input batch), so {', '.join(extra)}: "
            "extra cannot give those segments samples of their own. Use verl's v1 trainer "
            "(trainer.use_v1=true, verl's default), or set "
            + ", ".join(f"{k}: drop" for k in extra)
            + " in the agent-loop YAML to train only each trial's first segment (what is dropped "
            "is counted in the step metrics, trialflow/tokens/dropped/*)."
        )


@dataclass(frozen=True)
class SampleIdentity:
    step: int
    validate: bool
    row: int
    rollout: int
    rollouts: int

    @property
    def sample_index(self) -> int:
        return self.row * self.rollouts + self.rollout

    @property
    def policy_version(self) -> int | None:
        """The weights version (verl's numbering: the ``global_steps`` of the
        ``update_weights`` that loaded them) the replicas serve while this sample generates.
        verl syncs ``update_weights(s)`` at the end of step ``s``, validates, then increments
        the step: a training batch of step ``s`` samples weights ``s - 1`` (the initial sync
        is ``update_weights(0)``), a validation batch of step ``s`` weights ``s``. The one
        place trialflow derives a version from a step; a worker proxy that heard the
        trainer's broadcast (`trialflow.policy_sync`) records that instead. None: no step
        (``-1``)."""
        if self.step < 0:
            return None
        return self.step if self.validate else self.step - 1

    def batch_id(self, run_name: str, split: str | None = None) -> str:
        return f"{run_name}-{split or ('val' if self.validate else 'train')}-step{self.step}"


def _scalar(value: Any) -> Any:
    return value.item() if isinstance(value, np.generic) else value


def resolve_identity(kwargs: dict[str, Any], default_rollouts: int) -> SampleIdentity:
    """A sample's identity from the row kwargs verl passes to ``run`` (see module docstring)."""
    if f"{STAMP_PREFIX}step" in kwargs:
        get = lambda k: _scalar(kwargs[STAMP_PREFIX + k])  # noqa: E731
        return SampleIdentity(
            step=int(get("step")),
            validate=bool(get("validate")),
            row=int(get("row")),
            rollout=int(get("rollout")),
            rollouts=int(get("rollouts")),
        )
    if "global_steps" in kwargs and "session_id" in kwargs and "index" in kwargs:
        return SampleIdentity(
            step=int(_scalar(kwargs["global_steps"])),
            validate=bool(kwargs.get("validate", False)),
            row=int(_scalar(kwargs["index"])),
            rollout=int(_scalar(kwargs["session_id"])),
            rollouts=max(default_rollouts, int(_scalar(kwargs["session_id"])) + 1),
        )
    raise TrialIdentityError(
        "no step/rollout identity in the row: set +actor_rollout_ref.rollout.agent.agent_loop_manager_class="
        "trialflow.verl.agent_loop.TemporalAgentLoopManager (or use verl's v1 trainer)"
    )


def stamp_identity(non_tensor_batch: dict[str, np.ndarray], meta_info: dict[str, Any]) -> None:
    """Add ``trialflow_*`` identity columns to a (repeated, interleaved) generation batch.

    Rows with consecutive equal ``uid`` are the rollouts of one prompt; without ``uid``
    every row is its own prompt. The step is ``meta_info["global_steps"]`` (-1 if absent).
    """
    n = len(next(iter(non_tensor_batch.values())))
    uids = non_tensor_batch.get("uid")
    rows, rollouts = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
    row = -1
    for i in range(n):
        if uids is not None and i > 0 and uids[i] == uids[i - 1]:
            rollouts[i] = rollouts[i - 1] + 1
        else:
            row += 1
        rows[i] = row
    group = np.zeros(n, dtype=np.int64)
    for r in range(row + 1):
        group[rows == r] = (rows == r).sum()
    non_tensor_batch[STAMP_PREFIX + "step"] = np.full(
        n, int(meta_info.get("global_steps", -1)), dtype=np.int64
    )
    non_tensor_batch[STAMP_PREFIX + "validate"] = np.full(n, bool(meta_info.get("validate", False)))
    non_tensor_batch[STAMP_PREFIX + "row"] = rows
    non_tensor_batch[STAMP_PREFIX + "rollout"] = rollouts
    non_tensor_batch[STAMP_PREFIX + "rollouts"] = np.full(n, int(group.max()) if n else 1, dtype=np.int64)


def _loop_configs(config: Any) -> list[LoopConfig]:
    """Our entries in the agent-loop YAML verl's workers will load."""
    path = config.actor_rollout_ref.rollout.agent.get("agent_loop_config_path")
    if not path:
        return []
    entries: Any = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    ours = [e for e in entries or [] if str(e.get("_target_", "")).endswith(".TemporalAgentLoop")]
    return [
        LoopConfig.model_validate({k: v for k, v in e.items() if k in LoopConfig.model_fields}) for e in ours
    ]


class TemporalAgentLoopManager(AgentLoopManager):
    """verl's classic ``AgentLoopManager`` (``trainer.use_v1=false``): stamps each row's trial
    identity first, and afterwards applies the group policy over the whole step batch
    (`trialflow.verl.groups`) and adds the step's `signal.step_metrics` to the timing
    metrics verl logs (``timing_s/trialflow/...``: the one dict of the classic trainer's
    step that the manager's output reaches)."""

    def __init__(self, config, *args: Any, **kwargs: Any) -> None:
        self.trialflow_loops = self.check_config(config)
        super().__init__(config, *args, **kwargs)

    @staticmethod
    def check_config(config: Any) -> list[LoopConfig]:
        """Refuse a configuration this manager cannot serve; our loops' configs otherwise."""
        if trainer_kind(config) != "classic":
            raise UnsupportedTrainer(
                "TemporalAgentLoopManager is for verl's classic trainer (trainer.use_v1=false); under "
                "verl's v1 trainer leave actor_rollout_ref.rollout.agent.agent_loop_manager_class unset "
                "(v1's own AgentLoopManagerTQ passes every sample's identity)"
            )
        loops = _loop_configs(config)
        for loop in loops:
            check_trainer(config, loop)
        return loops

    @auto_await
    async def generate_sequences(self, prompts):
        stamp_identity(prompts.non_tensor_batch, prompts.meta_info)
        output = await super().generate_sequences(prompts)
        policy = self.trialflow_loops[0].invalid_groups if self.trialflow_loops else "mask_group"
        if policy == "mask_group":
            apply_group_mask(output, prompts.non_tensor_batch.get("uid"))
        output.meta_info.setdefault("timing", {}).update(step_metrics(r for r in _rows(output) if r))
        return output


# The per-sample columns the step's accounting reads (extra_fields keys of convert.extra_fields).
_ACCOUNTING = (
    "trial_id",
    "reward_valid",
    "termination_reason",
    "policy_tokens",
    "trained_tokens",
    "masked",
    "masked_by",
    "overlong",
    "dropped_tokens",
)


def _rows(output: Any) -> list[dict[str, Any] | None]:
    """Each row's accounting fields; None for a row no trial made (another agent loop)."""
    nt = output.non_tensor_batch
    if "trial_id" not in nt:
        return [None] * len(output)
    return [
        {k: nt[k][i] for k in _ACCOUNTING} if nt["trial_id"][i] is not None else None
        for i in range(len(output))
    ]


def apply_group_mask(output: Any, uids: Any) -> None:
    """``mask_group`` over verl's classic output batch, in place: every row of a group
    (rows with an equal ``uid``) with an invalid member gets an all-zero response mask."""
    rows = _rows(output)
    keys = list(uids) if uids is not None else list(range(len(rows)))
    valid = [r is None or bool(r["reward_valid"]) for r in rows]
    nt, mask = output.non_tensor_batch, output.batch["response_mask"]
    for i, spoiled in enumerate(groups_to_mask(keys, valid)):
        if spoiled and rows[i] is not None:
            mask[i] = 0
            nt["masked"][i] = True
            nt["masked_by"][i] = nt["masked_by"][i] or "invalid_group"
            nt["trained_tokens"][i] = 0


async def verl_replica_urls(server_manager: Any) -> list[str]:
    """HTTP base URLs of the rollout servers verl runs now (asked on every call: the
    load balancer's set changes when verl adds or removes replicas)."""
    try:
        balancer = server_manager._load_balancer  # verl 0.9.1 LLMServerClient keeps the router actor here
    except AttributeError as err:
        raise ReplicaDiscoveryError(f"{type(server_manager).__name__} has no load balancer handle") from err
    addresses = await balancer.get_all_servers.remote()
    if not addresses:
        raise ReplicaDiscoveryError("verl's load balancer lists no rollout servers")
    return [a if a.startswith(("http://", "https://")) else f"http://{a}" for a in addresses]


_clients: dict[tuple[str, str, int], Client] = {}
_gates: dict[int, GroupGate] = {}


def _gate() -> GroupGate:
    # one gate per event loop: a prompt's sessions all run on the v1 worker's loop
    return _gates.setdefault(id(asyncio.get_running_loop()), GroupGate())


_stores: dict[str, ResultStore] = {}


async def _client(settings: TrialflowSettings) -> Client:
    # one client per process and event loop: verl creates a loop object per sample
    key = (settings.temporal_address, settings.temporal_namespace, id(asyncio.get_running_loop()))
    if key not in _clients:
        _clients[key] = await connect_temporal(settings)
    return _clients[key]


def _store(settings: TrialflowSettings) -> ResultStore:
    key = settings.model_dump_json(include={"s3_endpoint", "s3_bucket", "s3_prefix", "store_dir"})
    if key not in _stores:
        _stores[key] = open_store(settings)
    return _stores[key]


def _plain(value: Any) -> Any:
    return OmegaConf.to_container(value, resolve=True) if isinstance(value, DictConfig) else value


class TemporalAgentLoop(AgentLoopBase):
    """One sample = one trial workflow. Constructor keywords: `LoopConfig` fields."""

    def __init__(
        self,
        trainer_config,
        server_manager,
        tokenizer,
        processor,
        dataset_cls,
        data_config,
        hf_model_type: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            trainer_config,
            server_manager,
            tokenizer,
            processor,
            dataset_cls,
            data_config,
            hf_model_type=hf_model_type,
        )
        ours = {k: _plain(v) for k, v in kwargs.items() if k in LoopConfig.model_fields}
        ignored = sorted(set(kwargs) - set(ours) - _VERL_KWARGS)
        if ignored:
            log.warning("TemporalAgentLoop ignores unknown config keys %s", ignored)
        self.loop_config = LoopConfig.model_validate(ours)
        check_trainer(self.config, self.loop_config)
        self.settings = load_settings(**self.loop_config.settings)
        rollout = self.rollout_config
        self.convert_config = ConvertConfig(
            prompt_length=int(rollout.prompt_length),
            response_length=int(rollout.response_length),
            filler_token_id=tokenizer.pad_token_id
            if tokenizer.pad_token_id is not None
            else tokenizer.eos_token_id,
            experts_shape=self.loop_config.routed_experts,
            side=self.loop_config.side_segments,
            rewritten=self.loop_config.rewritten_segments,
            steps=self.loop_config.step_segments,
            invalid_reward=self.loop_config.invalid_reward,
            mask_invalid=self.loop_config.mask_invalid,
            overlong_filter=self.loop_config.overlong_filter,
        )

    def _run_name(self) -> str:
        return self.loop_config.run_name or str(self.config.trainer.experiment_name)

    async def _replicas(self) -> list[str] | None:
        replicas = self.loop_config.replicas
        if replicas == "worker":
            return None
        if replicas == "verl":
            return await verl_replica_urls(self.server_manager)
        return list(replicas)

    async def build_spec(self, sampling_params: dict[str, Any], kwargs: dict[str, Any]) -> TrialSpec:
        """The trial for this row (pure apart from asking verl for its replicas)."""
        row = TrialRow.model_validate(_plain((kwargs.get("extra_info") or {}).get("trialflow") or {}))
        rollouts = int(self.rollout_config.n)
        ident = resolve_identity(kwargs, rollouts)
        cfg = self.loop_config
        sampling: dict[str, Any] = {
            k: _scalar(sampling_params[k]) for k in ("temperature", "top_p", "top_k") if k in sampling_params
        }
        sampling.update(cfg.sampling.model_dump(exclude_none=True))
        task_path = row.task_path
        return TrialSpec(
            batch_id=ident.batch_id(self._run_name(), row.split),
            task_path=task_path,
            task_name=row.task_name or task_path.rstrip("/").rsplit("/", 1)[-1],
            scaffold=row.scaffold or cfg.scaffold,
            scaffold_options=row.scaffold_options
            if row.scaffold_options is not None
            else (cfg.scaffold_options if not row.scaffold or row.scaffold == cfg.scaffold else {}),
            sample_index=ident.sample_index,
            attempt_limit=row.attempt_limit or cfg.attempt_limit,
            agent_timeout_s=row.agent_timeout_s or cfg.agent_timeout_s,
            **{
                k: v
                for k in ("heartbeat_timeout_s", "host_schedule_timeout_s")
                if (v := getattr(cfg, k)) is not None
            },
            model=cfg.model or str(self.config.actor_rollout_ref.model.path),
            sampling=sampling,
            replicas=await self._replicas(),
            # the sample verl trains (rollout.prompt_length + response_length): the session keeps the trajectory in it
            max_context_tokens=self.convert_config.prompt_length + self.convert_config.response_length,
            max_response_tokens=self.convert_config.response_length,
            step=ident.step,
            policy_version=ident.policy_version,
            network=self.settings.run_network(),  # each phase's network: the loop's settings
            metadata={
                "row": str(ident.row),
                "rollout": str(ident.rollout),
                "validate": str(ident.validate).lower(),
            },
        )

    # verl's v1 worker (verl/trainer/ppo/v1/agent_loop_tq.py) takes one output or a list;
    # AgentLoopBase.run is annotated with one only.
    async def run(  # type: ignore[override]
        self, sampling_params: dict[str, Any], **kwargs: Any
    ) -> AgentLoopOutput | list[AgentLoopOutput]:
        # verl's v1 worker: the prompt's sessions meet in the gate (joined before any await);
        # the classic manager masks groups over the whole batch instead.
        member = self._join_group(kwargs)
        try:
            spec = await self.build_spec(sampling_params, kwargs)
            trial = await self._run_trial(spec)
            converted, metrics = self._convert(trial, bool(sampling_params.get("logprobs", True)))
            if member is not None and not await member.settle(trial.result.reward_valid):
                for sample in converted.samples:
                    sample.mask_out("invalid_group")
        except BaseException:
            if member is not None:
                member.abandon()
            raise
        outputs = [self._output(converted, s, trial, metrics) for s in converted.samples]
        return outputs if len(outputs) > 1 else outputs[0]

    def _join_group(self, kwargs: dict[str, Any]) -> GroupMember | None:
        """verl's v1 worker's rows (``session_id`` and ``uid``, no classic stamp) join the gate."""
        if self.loop_config.invalid_groups != "mask_group" or f"{STAMP_PREFIX}step" in kwargs:
            return None
        if "session_id" not in kwargs or "uid" not in kwargs:
            return None
        return _gate().join(str(kwargs["uid"]))

    async def _run_trial(self, spec: TrialSpec) -> StepTrial:
        """The trial as a batch of one, its result and trajectory read back (all the I/O)."""
        cfg = self.loop_config
        policy = StragglerPolicy(deadline_s=cfg.trial_timeout_s, cancel_wait_s=cfg.cancel_wait_s)
        step = await run_step(
            await _client(self.settings),
            _store(self.settings),
            [spec],
            policy,
            task_queue=cfg.task_queue or self.settings.task_queue,
        )
        trial = step.trials[0]
        if trial.load_error:
            log.warning("trial %s: trajectory not read (%s)", spec.trial_id, trial.load_error)
        return trial

    def _convert(self, trial: StepTrial, logprobs: bool) -> tuple[ConvertedTrial, AgentLoopMetrics]:
        config = self.convert_config
        if not logprobs:
            config = ConvertConfig(**{**config.__dict__, "with_logprobs": False})
        steps = trial.step_trajectories if trial.result.step_results else None  # a multi-step task
        converted = convert_trial(trial.trajectory, trial.result, config, steps)
        for sample in converted.samples:
            # verl's v1 metrics read every sample's versions as ints; a sample whose segment
            # recorded none (a placeholder, a turn without a version) ran under its trial's
            if sample.policy_version_min is None and trial.spec.policy_version is not None:
                sample.policy_version_min = sample.policy_version_max = trial.spec.policy_version
        metrics = AgentLoopMetrics(**loop_metrics(trial.trajectory, trial.result, steps or ()))
        return converted, metrics

    @staticmethod
    def _output(
        converted: ConvertedTrial, sample: LoopSample, trial: StepTrial, metrics: AgentLoopMetrics
    ) -> AgentLoopOutput:
        fields = extra_fields(converted, sample, trial.result)
        fields["trial_cancelled"] = trial.cancelled
        fields["trajectory_error"] = trial.load_error
        # a lost last attempt: the tokens before the crash, rebuilt from its checkpoints
        fields["trajectory_partial"] = trial.partial
        return AgentLoopOutput(
            **sample.output_fields(),
            reward_score=converted.reward_score,
            num_turns=2 * trial.result.turns,  # verl counts messages: one env + one assistant per turn
            metrics=metrics.model_copy(),
            extra_fields=fields,
        )
