"""Submit a batch of trials and wait for it: the client side of TrialWorkflow.

Used by the CLI and by the verl agent loop. All functions take a connected Temporal
`Client` (see `connect`, which installs the pydantic data converter the workflow needs).

Idempotence: workflow ids are deterministic (`TrialSpec.trial_id`); `submit` starts with
``id_conflict_policy=USE_EXISTING`` (a running trial is attached to) and
``id_reuse_policy=REJECT_DUPLICATE`` (a finished trial is attached to as well, its stored
result is what `wait` returns). Re-submitting a batch therefore never duplicates trials.

Failures as data: `wait` always yields a `TrialResult`. A workflow that failed or was
cancelled or terminated outside the workflow's own handling (should be rare: the workflow
returns errors as data) becomes a result with termination "infra_error"/"cancelled" and
`error` set.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

from temporalio.client import (
    Client,
    WorkflowExecutionStatus,
    WorkflowFailureError,
    WorkflowHandle,
    WorkflowQueryFailedError,
)
from temporalio.common import (
    SearchAttributeKey,
    SearchAttributePair,
    TypedSearchAttributes,
    WorkflowIDConflictPolicy,
    WorkflowIDReusePolicy,
)
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, TLSConfig

from trialflow import trial_details
from trialflow.scaffolds import check_scaffold
from workflows.shared import (
    SA_BATCH,
    SA_REWARD_VALID,
    SA_SCAFFOLD,
    SA_STEP,
    SA_TASK,
    SEARCH_ATTRIBUTE_TYPES,
    SHARED_QUEUE,
    WORKFLOW_NAME,
    StepResult,
    TrialError,
    TrialProgress,
    TrialResult,
    TrialSpec,
    safe_id_part,
)

# A workflow task handed to a host that stopped answering (its long poll was already at the
# server) is retried elsewhere after this; Temporal's default is 10 s. A trial's workflow tasks
# take milliseconds (docs/deploy.md, "Failover").
WORKFLOW_TASK_TIMEOUT = timedelta(seconds=5)

ResultCallback = Callable[[TrialResult], Awaitable[None] | None]


async def connect(
    address: str, namespace: str = "default", *, tls: TLSConfig | bool = False, api_key: str | None = None
) -> Client:
    """A client with the pydantic data converter (TrialSpec/TrialResult are pydantic). `tls`
    and `api_key` are temporalio's own (`trialflow.cluster.connect_temporal` makes them from
    the settings)."""
    return await Client.connect(
        address, namespace=namespace, data_converter=pydantic_data_converter, tls=tls, api_key=api_key
    )


async def ensure_search_attributes(client: Client, namespace: str = "default") -> None:
    """Register any of the trial workflows' search attributes (`SEARCH_ATTRIBUTE_TYPES`)
    missing on the server; a no-op when all are there. Needed for a server not started with
    our ``--search-attribute`` flags: starting a workflow with an unknown one fails."""
    from temporalio.api.enums.v1 import IndexedValueType
    from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest, ListSearchAttributesRequest

    listed = await client.operator_service.list_search_attributes(
        ListSearchAttributesRequest(namespace=namespace)
    )
    missing = {
        name: IndexedValueType.Value(f"INDEXED_VALUE_TYPE_{kind.upper()}")
        for name, kind in SEARCH_ATTRIBUTE_TYPES.items()
        if name not in listed.custom_attributes
    }
    if missing:
        await client.operator_service.add_search_attributes(
            AddSearchAttributesRequest(namespace=namespace, search_attributes=missing)
        )


class TrialIdCollision(ValueError):
    """Two different trials of one batch would get the same workflow id (raised before
    anything is submitted). The message lists every clash, one per line."""


def task_labels(task_paths: Sequence[str | Path]) -> list[str]:
    """A name per task directory, unique within the batch: its basename, or as many
    trailing path parts as it takes to tell it from the others (``a/fix-bug`` and
    ``b/fix-bug``). Uniqueness is judged on the id-safe form (`safe_id_part`), since
    that is what workflow ids hold. Raises `TrialIdCollision` when a directory is given
    twice or two paths cannot be told apart."""
    resolved = [Path(p).resolve() for p in task_paths]
    seen: dict[Path, int] = {}
    problems = []
    for i, path in enumerate(resolved):
        if path in seen:
            problems.append(f"{path}: given twice (use --samples for more trials of one task)")
        seen.setdefault(path, i)
    if problems:
        raise TrialIdCollision("\n".join(problems))
    depth = [1] * len(resolved)

    def label(i: int) -> str:
        return "/".join(resolved[i].parts[-depth[i] :])

    while True:
        by_id: dict[str, list[int]] = {}
        for i in range(len(resolved)):
            by_id.setdefault(safe_id_part(label(i)), []).append(i)
        clashes = [group for group in by_id.values() if len(group) > 1]
        if not clashes:
            return [label(i) for i in range(len(resolved))]
        for group in clashes:
            for i in group:
                if depth[i] >= len(resolved[i].parts):
                    names = ", ".join(str(resolved[j]) for j in group)
                    raise TrialIdCollision(f"task directories {names} give the same trial id")
                depth[i] += 1


def check_unique_ids(specs: Sequence[TrialSpec]) -> None:
    """Refuse a batch in which two different trials share a workflow id (the second would
    silently attach to the first). Same id with the same task and sample is one trial."""
    first: dict[str, TrialSpec] = {}
    problems = []
    for spec in specs:
        other = first.setdefault(spec.trial_id, spec)
        if other is not spec and (other.task_path, other.sample_index) != (spec.task_path, spec.sample_index):
            problems.append(f"{spec.trial_id}: both {other.task_path} and {spec.task_path}")
    if problems:
        raise TrialIdCollision("trial ids clash:\n" + "\n".join(problems))


def make_specs(
    batch_id: str,
    task_paths: Iterable[str | Path],
    scaffold: str,
    *,
    samples: int = 1,
    check: bool = True,
    **spec_fields: Any,
) -> list[TrialSpec]:
    """`samples` trials per task (sample_index 0..samples-1), in task order.

    The task name is the task directory's name, or its shortest unique trailing path
    (`task_labels`) when two directories of the batch share a name; a directory given
    twice raises `TrialIdCollision`. `spec_fields` go to every TrialSpec
    (attempt_limit, agent_timeout_s, model, scaffold_options, ...). The scaffold is built
    once here with its `scaffold_options` (`check_scaffold`), so an unknown name, an
    unimportable import path or a bad option raises `UnknownScaffold` before anything is
    submitted. ``check=False`` leaves that check to the workers (a scaffold only they can
    import): an unknown one then ends its trial as a recorded, non-retryable `UnknownScaffold`.
    """
    if check:
        check_scaffold(scaffold, spec_fields.get("scaffold_options"))
    paths = [Path(p).resolve() for p in task_paths]
    specs = []
    for resolved, name in zip(paths, task_labels(paths), strict=True):
        for i in range(samples):
            specs.append(
                TrialSpec(
                    batch_id=batch_id,
                    task_path=str(resolved),
                    task_name=name,
                    scaffold=scaffold,
                    sample_index=i,
                    **spec_fields,
                )
            )
    return specs


def search_attributes(spec: TrialSpec) -> TypedSearchAttributes:
    pairs: list[SearchAttributePair[Any]] = [
        SearchAttributePair(SearchAttributeKey.for_keyword(SA_BATCH), spec.batch_id),
        SearchAttributePair(SearchAttributeKey.for_keyword(SA_TASK), spec.task_name),
        SearchAttributePair(SearchAttributeKey.for_keyword(SA_SCAFFOLD), spec.scaffold),
    ]
    if spec.step is not None:
        pairs.append(SearchAttributePair(SearchAttributeKey.for_int(SA_STEP), spec.step))
    return TypedSearchAttributes(pairs)


async def submit_one(client: Client, spec: TrialSpec, task_queue: str = SHARED_QUEUE) -> WorkflowHandle:
    """Start the trial, or attach to the run that already has its id."""
    try:
        return await client.start_workflow(
            WORKFLOW_NAME,
            spec,
            id=spec.trial_id,
            task_queue=task_queue,
            result_type=TrialResult,
            id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            search_attributes=search_attributes(spec),
            memo={
                "spec": spec.model_dump(mode="json"),
                "replay_of": spec.replay_of or "",
            },
            static_summary=trial_details.summary(spec),
            static_details=trial_details.start_details(spec),
            task_timeout=WORKFLOW_TASK_TIMEOUT,
        )
    except WorkflowAlreadyStartedError:
        # A closed run with this id exists: its result is the trial's result.
        return client.get_workflow_handle(spec.trial_id, result_type=TrialResult)


async def submit(
    client: Client,
    specs: Sequence[TrialSpec],
    task_queue: str = SHARED_QUEUE,
    concurrency: int = 32,
) -> list[WorkflowHandle]:
    """Submit every spec (bounded concurrency); handles in spec order. Raises
    `TrialIdCollision` before submitting anything when two trials would share an id."""
    check_unique_ids(specs)
    gate = asyncio.Semaphore(concurrency)

    async def one(spec: TrialSpec) -> WorkflowHandle:
        async with gate:
            return await submit_one(client, spec, task_queue)

    return list(await asyncio.gather(*(one(s) for s in specs)))


def _failed_result(spec: TrialSpec, err: BaseException) -> TrialResult:
    cause = getattr(err, "cause", None) or err
    cancelled = type(cause).__name__ in {"CancelledError", "TerminatedError"}
    return TrialResult.of(
        spec,
        termination_reason="cancelled" if cancelled else "infra_error",
        error=TrialError(type=type(cause).__name__, message=str(cause), phase="pending"),
    )


async def wait_one(handle: WorkflowHandle, spec: TrialSpec) -> TrialResult:
    try:
        return await handle.result()
    except WorkflowFailureError as err:
        return _failed_result(spec, err)


async def wait(
    handles: Sequence[WorkflowHandle],
    specs: Sequence[TrialSpec],
    on_result: ResultCallback | None = None,
) -> list[TrialResult]:
    """Wait for every trial; `on_result` is called as each finishes. Results in spec order."""
    results: list[TrialResult | None] = [None] * len(specs)

    async def one(i: int) -> None:
        result = await wait_one(handles[i], specs[i])
        results[i] = result
        if on_result is not None:
            maybe = on_result(result)
            if asyncio.iscoroutine(maybe):
                await maybe

    await asyncio.gather(*(one(i) for i in range(len(specs))))
    return [r for r in results if r is not None]


async def run(
    client: Client,
    specs: Sequence[TrialSpec],
    on_result: ResultCallback | None = None,
    task_queue: str = SHARED_QUEUE,
) -> list[TrialResult]:
    """Submit and wait: the one call most callers want."""
    handles = await submit(client, specs, task_queue)
    return await wait(handles, specs, on_result)


@dataclass(frozen=True)
class TrialStatus:
    """One trial of a batch as the visibility store sees it (no result fetch)."""

    workflow_id: str
    status: str
    task: str | None
    reward: float | None
    termination: str | None
    reward_valid: bool | None  # None: not recorded (older trials, or still running)
    replay_of: str | None
    rewards: dict[str, float] | None = None  # the verifier's components (from the memo)
    steps: tuple[StepResult, ...] = ()  # a multi-step trial's steps (from the memo; no trajectory URIs)
    # `with_progress` only: a running trial's live progress (its `progress` query; None when no
    # worker answered it), a finished trial's result (phase, attempt, turns, tokens and why)
    progress: TrialProgress | None = None
    result: TrialResult | None = None


async def list_trials(client: Client, batch_id: str) -> list[TrialStatus]:
    """Every trial workflow (reruns of failed trials included) with TrialBatchId = batch_id, by id.

    Visibility is eventually consistent: a trial started a moment ago may be missing.
    """
    out = []
    query = f'{SA_BATCH} = "{batch_id}"'
    async for wf in client.list_workflows(query=query):
        sa = wf.typed_search_attributes
        memo = await wf.memo()
        out.append(
            TrialStatus(
                workflow_id=wf.id,
                status=wf.status.name if wf.status else "UNKNOWN",
                task=sa.get(SearchAttributeKey.for_keyword(SA_TASK)),
                reward=sa.get(SearchAttributeKey.for_float("TrialReward")),
                termination=sa.get(SearchAttributeKey.for_keyword("TrialTermination")),
                reward_valid={"true": True, "false": False}.get(
                    sa.get(SearchAttributeKey.for_keyword(SA_REWARD_VALID)) or ""
                ),
                replay_of=memo.get("replay_of") or None,
                rewards=memo.get("rewards"),
                steps=tuple(StepResult.model_validate(s) for s in memo.get("steps") or ()),
            )
        )
    return sorted(out, key=lambda t: t.workflow_id)


PROGRESS_QUERY_TIMEOUT = timedelta(seconds=5)


async def with_progress(
    client: Client, trials: Sequence[TrialStatus], concurrency: int = 16
) -> list[TrialStatus]:
    """`trials` with each running one's live progress (the workflow's `progress` query) and
    each completed one's result: what `trialflow status` shows beyond visibility. A query no
    worker answers within `PROGRESS_QUERY_TIMEOUT` leaves `progress` None (the trial waits
    for a worker)."""
    gate = asyncio.Semaphore(concurrency)

    async def one(t: TrialStatus) -> TrialStatus:
        handle = client.get_workflow_handle(t.workflow_id, result_type=TrialResult)
        async with gate:
            if t.status == WorkflowExecutionStatus.RUNNING.name:
                try:
                    progress = await handle.query(
                        "progress", result_type=TrialProgress, rpc_timeout=PROGRESS_QUERY_TIMEOUT
                    )
                except (RPCError, WorkflowQueryFailedError):
                    return t
                return replace(t, progress=progress)
            if t.status == WorkflowExecutionStatus.COMPLETED.name:
                return replace(t, result=await handle.result())
        return t

    return list(await asyncio.gather(*(one(t) for t in trials)))


async def spec_of(client: Client, workflow_id: str) -> TrialSpec:
    """The inputs a trial was started with (from its memo)."""
    desc = await client.get_workflow_handle(workflow_id).describe()
    return TrialSpec.model_validate((await desc.memo())["spec"])


async def replay_failed(client: Client, batch_id: str) -> list[TrialSpec]:
    """Specs that rerun each failed trial of the batch with the same inputs (new trials).

    A trial counts as failed when it closed with an error in its result or an invalid reward
    (a verifier that crashed), or when its
    workflow itself did not complete. Trials already rerun successfully are skipped;
    the new spec's rerun number (`TrialSpec.replay`) follows the highest existing rerun of that trial.
    """
    trials = await list_trials(client, batch_id)
    by_original: dict[str, list[TrialStatus]] = {}
    for t in trials:
        by_original.setdefault(t.replay_of or t.workflow_id, []).append(t)
    specs = []
    for original, runs in sorted(by_original.items()):
        if any(r.status == "RUNNING" for r in runs):
            continue
        numbers = {r.workflow_id: replay_number(original, r.workflow_id) for r in runs}
        latest = max(runs, key=lambda r: numbers[r.workflow_id])
        if not await _failed(client, latest):
            continue
        spec = await spec_of(client, original)
        update = {"replay_of": original, "replay": max(numbers.values()) + 1}
        specs.append(spec.model_copy(update=update))
    return specs


def replay_number(original_id: str, workflow_id: str) -> int:
    """0 for the original trial, n for its ``-r{n}`` rerun (numeric, so r10 > r9)."""
    if workflow_id == original_id:
        return 0
    return int(workflow_id.removeprefix(f"{original_id}-r"))


async def _failed(client: Client, trial: TrialStatus) -> bool:
    if trial.status != WorkflowExecutionStatus.COMPLETED.name:
        return True
    result = await client.get_workflow_handle(trial.workflow_id, result_type=TrialResult).result()
    return result.failed or not result.reward_valid
