"""`run`, `status`, `replay`: submit trials (with an in-process worker unless told otherwise),
follow them live, list a batch from Temporal visibility."""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from pydantic import ValidationError
from temporalio.client import Client

from trialflow import batch, batch_index, trial_details
from trialflow.admission import AdmissionReport, read_reports
from trialflow.cli._app import (
    ModelDirOpt,
    ReplicaOpt,
    S3Opt,
    StoreDirOpt,
    TemporalOpt,
    console,
    say_store,
    settings_from_flags,
    worker_logging,
)
from trialflow.cli._views import admission_table, results_table, status_table, trial_progress
from trialflow.cluster import connect_temporal
from trialflow.errors import ObjectNotFound, StorageError, UnknownSandboxBackend, UnknownScaffold
from trialflow.inspection import record_skipped
from trialflow.preflight import InProcessModel, RunCheck, check_batch
from trialflow.sandbox.gpus import host_gpus
from trialflow.scaffolds.registry import parse_scaffold_options, register_scaffold
from trialflow.settings import TrialflowSettings
from trialflow.storage import open_store
from workflows.shared import SA_BATCH, RunNetworkMode, Sampling, TrialResult, TrialSpec

# The run's say in each phase's network (trialflow.sandbox.network; None: the settings').
ForcedNetworkOpt = Annotated[
    RunNetworkMode | None,
    typer.Option(help="the phase's mode whatever the task states", show_default=False),
]
DefaultNetworkOpt = Annotated[
    RunNetworkMode | None,
    typer.Option(help="the phase's mode where the task states none", show_default=False),
]

if TYPE_CHECKING:
    from trialflow.sandbox.image_check import ImageChecker


def _hosts_option(flag: str, phase: str) -> typer.models.OptionInfo:
    return typer.Option(
        flag,
        help=f"host, *.suffix, IP or CIDR merged into the {phase} phase's allowlist, as Harbor's (repeatable)",
        show_default=False,
    )


AgentHostsOpt = Annotated[list[str] | None, _hosts_option("--allow-agent-host", "agent")]
VerifierHostsOpt = Annotated[list[str] | None, _hosts_option("--allow-verifier-host", "verifier")]


@contextlib.asynccontextmanager
async def in_process_worker(
    settings: TrialflowSettings, client: Client, enabled: bool
) -> AsyncIterator[None]:
    """Run a worker in this process for the duration of the block."""
    if not enabled:
        yield
        return
    from trialflow.cli._worker import WorkerProcess  # Temporal workers, proxy, Docker: only when asked

    log_file = Path(".trialflow/logs") / f"worker-{settings.task_queue}-{os.getpid()}.log"
    console.print(f"in-process worker log: {log_file}", highlight=False, soft_wrap=True)
    with worker_logging(log_file):
        async with WorkerProcess(settings, client, in_process=True):
            yield


async def run_specs(
    settings: TrialflowSettings,
    specs: Sequence[TrialSpec],
    *,
    external_worker: bool,
    title: str,
) -> list[TrialResult]:
    """Submit `specs`, show a live progress bar, return the results. Interrupted (Ctrl-C),
    it says at once what happens to the trials and how to come back to them, shows the
    results so far, then stops the in-process worker (which drains first)."""
    client = await connect_temporal(settings)
    await batch.ensure_search_attributes(client, settings.temporal_namespace)
    done: list[TrialResult] = []
    async with in_process_worker(settings, client, enabled=not external_worker):
        with trial_progress(console, title, len(specs)) as on_result:

            def counted(result: TrialResult) -> None:
                done.append(result)
                on_result(result)

            try:
                return await batch.run(client, specs, on_result=counted, task_queue=settings.task_queue)
            except asyncio.CancelledError:
                _interrupted(settings, specs, done, external_worker)
                raise


def _interrupted(
    settings: TrialflowSettings, specs: Sequence[TrialSpec], done: list[TrialResult], external_worker: bool
) -> None:
    batch_id = specs[0].batch_id if specs else "?"
    console.print(f"\ninterrupted: {len(done)} of {len(specs)} trials finished")
    if done:
        console.print(results_table(done, title=f"batch {batch_id} (finished so far)"))
    where = (
        "they keep running on the external workers"
        if external_worker
        else f"the in-process worker stops now (it drains for up to {settings.drain_grace_s:g} s); "
        "the unfinished trials wait in Temporal for a worker"
    )
    console.print(
        f"{where}. `trialflow status {batch_id}` lists them; `trialflow run ... --batch-id {batch_id}` "
        "attaches again (finished trials are not re-run).",
        highlight=False,
        soft_wrap=True,
    )


def run(
    task_dirs: Annotated[list[Path], typer.Argument(help="Harbor task directories")],
    scaffold: Annotated[
        str | None,
        typer.Option(
            help="oracle, nop, claude-code, opencode, codex, terminus, ... or an import path "
            "my_pkg.my_mod:MyScaffold (default: settings' scaffold, oracle)"
        ),
    ] = None,
    scaffold_option: Annotated[
        list[str] | None,
        typer.Option(
            "--scaffold-option",
            help="KEY=VALUE for the scaffold's constructor, VALUE as JSON or else a string "
            "(repeatable), e.g. max_turns=20",
        ),
    ] = None,
    samples: Annotated[int, typer.Option(help="trials per task (samples of the same task)")] = 1,
    attempts: Annotated[
        int | None, typer.Option(hidden=True, help="deprecated: the old name of --samples")
    ] = None,
    backend: Annotated[
        str | None,
        typer.Option(
            help="the in-process worker's sandbox backend (default: settings' sandbox_backend, "
            "docker); external workers run the one their own settings name"
        ),
    ] = None,
    batch_id: Annotated[str | None, typer.Option(help="reuse to attach to an earlier batch")] = None,
    max_restarts: Annotated[int, typer.Option(help="new-sandbox attempts per trial")] = 3,
    agent_timeout: Annotated[float | None, typer.Option(help="seconds; default: the task's")] = None,
    external_worker: Annotated[bool, typer.Option(help="do not start an in-process worker")] = False,
    skip_invalid: Annotated[
        bool,
        typer.Option(
            "--skip-invalid",
            help="run the tasks without problems and list the others (in the output and the "
            "batch's report) instead of refusing the batch",
        ),
    ] = False,
    max_tokens: Annotated[
        int | None, typer.Option(help="cap on each turn's generated tokens (with the client's own cap)")
    ] = None,
    temperature: Annotated[float | None, typer.Option(help="sampling temperature")] = None,
    top_p: Annotated[float | None, typer.Option(help="nucleus sampling (0, 1]")] = None,
    top_k: Annotated[int | None, typer.Option(help="top-k sampling (-1: off)")] = None,
    seed: Annotated[int | None, typer.Option(help="sampling seed")] = None,
    stop: Annotated[list[str] | None, typer.Option(help="stop sequence (repeatable)")] = None,
    temporal: TemporalOpt = None,
    s3: S3Opt = None,
    store_dir: StoreDirOpt = None,
    replicas: ReplicaOpt = None,
    model_dir: ModelDirOpt = None,
    agent_network: ForcedNetworkOpt = None,
    agent_network_default: DefaultNetworkOpt = None,
    verifier_network: ForcedNetworkOpt = None,
    verifier_network_default: DefaultNetworkOpt = None,
    allow_agent_host: AgentHostsOpt = None,
    allow_verifier_host: VerifierHostsOpt = None,
) -> None:
    """Run SAMPLES trials of every task with SCAFFOLD, as one batch of Temporal workflows
    (each trial gets up to MAX_RESTARTS new-sandbox attempts).

    Network per phase: the task's; where it states none, --agent-network-default (no-network)
    and --verifier-network-default (public, Harbor's default); --agent-network /
    --verifier-network force a phase's mode whatever the task states; --allow-agent-host /
    --allow-verifier-host widen a phase's allowlist (a no-network phase becomes one)."""
    if attempts is not None:  # --attempts meant samples, not a trial's attempts
        console.print("[yellow]warning:[/] --attempts is deprecated: use --samples", highlight=False)
        samples = attempts
    sampling = sampling_from_flags(
        max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k, seed=seed, stop=stop
    )
    settings = settings_from_flags(
        temporal=temporal,
        s3=s3,
        store_dir=store_dir,
        replicas=replicas,
        model_dir=model_dir,
        agent_network=agent_network,
        agent_network_default=agent_network_default,
        verifier_network=verifier_network,
        verifier_network_default=verifier_network_default,
        agent_allowed_hosts=allow_agent_host or None,
        verifier_allowed_hosts=allow_verifier_host or None,
    )
    settings = _with_backend(settings, backend, external_worker)
    batch_id = batch_id or uuid.uuid4().hex[:10]
    scaffold = scaffold or settings.scaffold
    try:
        options = {**settings.scaffold_options, **parse_scaffold_options(scaffold_option or [])}
    except ValueError as err:
        raise typer.BadParameter(str(err), param_hint="--scaffold-option") from None
    for name, target in settings.extra_scaffolds.items():
        register_scaffold(name, target)
    check = check_batch(
        task_dirs,
        scaffold,
        samples=samples,
        scaffold_options=options,
        store=lambda: open_store(settings),
        model=None if external_worker else InProcessModel(settings.model_dir, settings.replica_urls),
        host_gpus=None if external_worker else host_gpus(),
        images=_image_checker(settings, external_worker, check_engine=bool(task_dirs)),
    )
    task_dirs, skipped = _refuse_or_skip(check, task_dirs, skip_invalid)
    try:
        specs = batch.make_specs(
            batch_id,
            task_dirs,
            scaffold,
            samples=samples,
            attempt_limit=max_restarts,
            agent_timeout_s=agent_timeout,
            model=settings.model_name,
            scaffold_options=options,
            network=settings.run_network(),
            sampling=sampling,
            viewer_url=settings.viewer_url,
        )
    except UnknownScaffold as err:
        raise typer.BadParameter(str(err), param_hint="--scaffold") from None
    batch_index.record(settings, batch_id)  # `inspect` / `report` find its store again
    if skip_invalid:  # the batch's record says what it left out (`report` shows it)
        record_skipped(open_store(settings), batch_id, skipped)
    console.print(f"batch [bold]{batch_id}[/]: {len(specs)} trials")
    say_store(settings)
    say_ui(settings, batch_id)
    results = asyncio.run(run_specs(settings, specs, external_worker=external_worker, title=scaffold))
    console.print(results_table(results, title=f"batch {batch_id}"))
    if skipped:
        console.print(f"{len(skipped)} task(s) skipped before submit (--skip-invalid):", highlight=False)
        for task, lines in skipped.items():
            console.print(f"  skipped {task}: {' | '.join(lines)}", highlight=False, soft_wrap=True)
    if any(trial_details.outcome(r) != "ok" for r in results):
        say_ui(settings, batch_id, failing_only=True)
    raise typer.Exit(1 if any(r.failed for r in results) else 0)


def _with_backend(
    settings: TrialflowSettings, backend: str | None, external_worker: bool
) -> TrialflowSettings:
    """The settings with the in-process worker's backend (--backend), checked before submit.
    The backend is the workers' choice: with --external-worker it is theirs, not this run's."""
    from trialflow.sandbox.registry import check_backend

    if backend is not None and external_worker:
        raise typer.BadParameter(
            "the workers run the backend their settings name (TRIALFLOW_SANDBOX_BACKEND); "
            "--backend is for the in-process worker",
            param_hint="--backend",
        )
    if external_worker:
        return settings
    if backend is not None:
        settings = settings.model_copy(update={"sandbox_backend": backend})
    try:
        check_backend(settings)
    except UnknownSandboxBackend as err:
        raise typer.BadParameter(str(err), param_hint="--backend") from None
    return settings


def _image_checker(settings: TrialflowSettings, external_worker: bool, check_engine: bool) -> ImageChecker:
    """The checker of the tasks' images: with the engine the in-process worker builds on; an
    external worker's engine is its own, so then only the Dockerfiles are read."""
    from trialflow.sandbox.image_check import ImageChecker  # the docker SDK only for `run`

    policy = settings.image_policy()
    if external_worker or not check_engine:
        return ImageChecker(None, policy)
    import docker

    try:
        client = docker.from_env()
        client.ping()
    except Exception as err:  # no engine, no permission: said before submit, as one line
        return ImageChecker(
            None, policy, engine_problem=f"{type(err).__name__}: {' '.join(str(err).split())[:300]}"
        )
    return ImageChecker(client, policy)


def _refuse_or_skip(
    check: RunCheck, task_dirs: list[Path], skip_invalid: bool
) -> tuple[list[Path], dict[str, list[str]]]:
    """Refuse the run (exit 2, every problem printed), or with --skip-invalid leave out the
    tasks with problems and say so; the tasks to run and {task directory: its problems}."""
    if check.general or (check.tasks and not skip_invalid) or len(check.tasks) == len(task_dirs):
        for line in check.problems:
            console.print(f"[red]error:[/] {line}", highlight=False, soft_wrap=True)
        n = len(check.problems)
        console.print(f"nothing submitted ({n} problem{'s' if n > 1 else ''})")
        raise typer.Exit(2)
    for lines in check.tasks.values():
        for line in lines:
            console.print(f"[yellow]skipped:[/] {line}", highlight=False, soft_wrap=True)
    return [p for p in task_dirs if p not in check.tasks], {str(p): v for p, v in check.tasks.items()}


def sampling_from_flags(**flags: object) -> Sampling:
    """The trial's sampling from `run`'s flags (None: the session default); a bad value is
    one line (typer's usage error), nothing submitted."""
    try:
        return Sampling.model_validate({k: v for k, v in flags.items() if v is not None and v != []})
    except ValidationError as err:
        first = err.errors()[0]
        name = "--" + str(first["loc"][0]).replace("_", "-") if first["loc"] else "sampling"
        raise typer.BadParameter(first["msg"], param_hint=name) from None


def say_ui(settings: TrialflowSettings, batch_id: str, failing_only: bool = False) -> None:
    """Where the batch is in the Temporal UI: all its trials, and the ones that ended invalid
    or by an error (a query to save as a view there; docs/ui.md)."""
    ui = settings.temporal_ui_url
    failing = trial_details.workflows_ui_url(trial_details.failing_query(batch_id), ui)
    if not failing_only:
        every = trial_details.workflows_ui_url(f'{SA_BATCH} = "{batch_id}"', ui)
        console.print(f"Temporal UI: {every}", highlight=False, soft_wrap=True)
    console.print(f"invalid or errored trials: {failing}", highlight=False, soft_wrap=True)


def status(batch_id: str, temporal: TemporalOpt = None) -> None:
    """List a batch's trials from Temporal visibility."""
    settings = settings_from_flags(temporal=temporal)

    async def go() -> list[batch.TrialStatus]:
        client = await connect_temporal(settings)
        return await batch.with_progress(client, await batch.list_trials(client, batch_id))

    trials = asyncio.run(go())
    if not trials:
        console.print(
            f"[red]error:[/] no trials of batch {batch_id!r} in Temporal at {settings.temporal_address}"
        )
        raise typer.Exit(1)
    console.print(status_table(trials, title=f"batch {batch_id}"))
    reports = _admission_reports(settings)
    if reports:
        console.print(admission_table(reports))


def _admission_reports(settings: TrialflowSettings) -> list[AdmissionReport]:
    """The workers' admission reports in the settings' store; none when it has no store
    (status needs only Temporal) or cannot be read now (said in one line)."""
    try:
        store = open_store(settings, create=False)
        reports, bad = read_reports(store)
    except ObjectNotFound:
        return []
    except StorageError as exc:
        console.print(f"[yellow]admission reports not read:[/] {exc}")
        return []
    for key, why in bad.items():
        console.print(f"[yellow]admission report {key} unreadable:[/] {why}")
    return reports


def replay(
    target: Annotated[str, typer.Argument(help="a batch id (--failed) or a trial id (--from-record)")],
    failed: Annotated[
        bool,
        typer.Option("--failed", help="rerun the batch's failed trials as new trials (ids -r1, -r2, ...)"),
    ] = False,
    from_record: Annotated[
        bool,
        typer.Option(
            "--from-record",
            help="re-run the trial's scaffold against its record (the proxy answers from the "
            "recorded model outputs, no replica); report where the environment or scaffold diverged",
        ),
    ] = False,
    attempt: Annotated[
        int | None, typer.Option(help="--from-record: the attempt (default: the last)")
    ] = None,
    task: Annotated[
        Path | None, typer.Option(help="--from-record: this task directory instead of the trial's")
    ] = None,
    external_worker: Annotated[bool, typer.Option(help="do not start an in-process worker")] = False,
    temporal: TemporalOpt = None,
    s3: S3Opt = None,
    store_dir: StoreDirOpt = None,
    replicas: ReplicaOpt = None,
    model_dir: ModelDirOpt = None,
) -> None:
    """Rerun a batch's failed trials with the same inputs (--failed: new trials, ids -r1, -r2, ...,
    linked to the originals), or re-run one trial's scaffold against its record, without a model
    (--from-record). Neither is the resume of a lost attempt, which the workflow does itself."""
    if failed == from_record:
        raise typer.BadParameter("give exactly one of --failed (a batch) or --from-record (a trial)")
    settings = settings_from_flags(
        temporal=temporal,
        s3=s3,
        store_dir=store_dir,
        replicas=replicas,
        model_dir=model_dir,
    )
    if from_record:
        from trialflow.cli._record import replay_record

        raise typer.Exit(replay_record(settings, target, attempt=attempt, task=task))

    async def go() -> list[TrialResult] | None:
        client = await connect_temporal(settings)
        if not await batch.list_trials(client, target):
            return None  # no such batch: not the same as a batch with nothing to rerun
        specs = await batch.replay_failed(client, target)
        console.print(f"rerunning {len(specs)} failed trial(s) of batch {target}")
        if not specs:
            return []
        return await run_specs(settings, specs, external_worker=external_worker, title="rerun")

    results = asyncio.run(go())
    if results is None:
        console.print(
            f"[red]error:[/] no trials of batch {target!r} in Temporal at {settings.temporal_address}"
        )
        raise typer.Exit(1)
    if results:
        console.print(results_table(results, title=f"reruns of batch {target}"))
    raise typer.Exit(1 if any(r.failed for r in results) else 0)
