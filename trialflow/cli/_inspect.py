"""`inspect` and `report`: a trial's or a batch's stored results, read from the store
(Temporal only to look up a trial's batch when it is not given)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated, NoReturn

import typer
from temporalio.service import RPCError, RPCStatusCode

from trialflow import batch, batch_index
from trialflow.cli._app import S3Opt, StoreDirOpt, TemporalOpt, console, settings_from_flags
from trialflow.cluster import connect_temporal
from trialflow.settings import TrialflowSettings
from workflows.shared import TrialResult


def _trial_batch(settings: TrialflowSettings, trial_id: str) -> str:
    async def go() -> str:
        client = await connect_temporal(settings)
        return (await batch.spec_of(client, trial_id)).batch_id

    try:
        return asyncio.run(go())
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            _fail(
                f"no trial {trial_id!r} in Temporal ({settings.temporal_address}); "
                "give --batch-id if it ran elsewhere"
            )
        _fail(f"cannot look up trial {trial_id!r} in Temporal ({settings.temporal_address}): {err.message}")
    except RuntimeError as err:  # the client could not connect
        _fail(f"cannot reach Temporal at {settings.temporal_address} to look up {trial_id!r}: {err}")


def _settings_for(batch_id: str | None, **flags) -> TrialflowSettings:
    """Flags win; else the store `trialflow run` recorded for the batch; else the settings."""
    recorded = batch_index.store_of(batch_id) if batch_id else None
    if recorded is None or flags.get("s3") or flags.get("store_dir"):
        return settings_from_flags(**flags)
    flags = {k: v for k, v in flags.items() if k not in ("s3", "store_dir")}
    # one store: the recorded S3 endpoint, else the recorded directory (a record keeps both fields)
    s3 = recorded.get("s3_endpoint")
    where = {"s3": s3, "store_dir": None if s3 else recorded.get("store_dir")}
    where.update({k: recorded[k] for k in ("s3_bucket", "s3_prefix") if recorded.get(k) is not None})
    return settings_from_flags(**flags, **where)


def _where(settings: TrialflowSettings) -> str:
    if settings.s3_endpoint:
        return f"s3://{settings.s3_bucket}/{settings.s3_prefix} at {settings.s3_endpoint}"
    return f"the store directory {settings.store_dir}"


def _fail(message: str) -> NoReturn:
    console.print(f"[red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(1)


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
    """Print a trial's stored result, its verifier output and every attempt's trajectory."""
    from rich.panel import Panel
    from rich.text import Text

    from trialflow.errors import ObjectNotFound
    from trialflow.inspection import attempt_view, result_view, verifier_logs
    from trialflow.storage import load_attempt, open_store, trial_result_key

    batch_id = batch_id or batch_index.batch_of_trial(trial_id)
    settings = _settings_for(batch_id, temporal=temporal, s3=s3, store_dir=store_dir)
    batch_id = batch_id or _trial_batch(settings, trial_id)
    store = open_store(settings, create=False)  # a reader: no bucket is made
    try:
        result = TrialResult.model_validate_json(store.get_bytes(trial_result_key(batch_id, trial_id)))
    except ObjectNotFound:
        _fail(f"no stored result for trial {trial_id!r} of batch {batch_id!r} in {_where(settings)}")
    console.print(result_view(result))
    for name, text in verifier_logs(store, result).items():
        console.print(Panel(Text(text.rstrip() or "(empty)"), title=f"verifier: {name}", title_align="left"))
    for record in result.attempt_records:
        console.print(attempt_view(load_attempt(store, record)))


def report(
    batch_id: str,
    out: Annotated[Path, typer.Option(help="HTML file to write")] = Path("report.html"),
    s3: S3Opt = None,
    store_dir: StoreDirOpt = None,
) -> None:
    """Write a self-contained HTML report of a batch from the results in the store."""
    from trialflow.inspection import batch_results, batch_skipped, verifier_logs
    from trialflow.report import write_report
    from trialflow.storage import open_store

    settings = _settings_for(batch_id, s3=s3, store_dir=store_dir)
    store = open_store(settings, create=False)  # a reader: no bucket is made
    results = batch_results(store, batch_id)
    if not results:
        _fail(f"no results stored for batch {batch_id!r} in {_where(settings)}")
    logs = {r.trial_id: verifier_logs(store, r) for r in results}
    skipped = batch_skipped(store, batch_id)
    path = write_report(out, results, title=f"batch {batch_id}", verifier_logs=logs, skipped=skipped)
    console.print(
        f"{len(results)} trials" + (f", {len(skipped)} tasks skipped" if skipped else "") + f" -> {path}"
    )
