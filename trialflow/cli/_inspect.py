"""`inspect` and `report`: a trial's or a batch's stored results, read from the store
(Temporal only to look up a trial's batch when it is not given)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer

from trialflow import batch
from trialflow.cli._app import S3Opt, StoreDirOpt, TemporalOpt, console, settings_from_flags
from trialflow.settings import TrialflowSettings
from workflows.shared import TrialResult


def _trial_batch(settings: TrialflowSettings, trial_id: str) -> str:
    async def go() -> str:
        client = await batch.connect(settings.temporal_address, settings.temporal_namespace)
        return (await batch.spec_of(client, trial_id)).batch_id

    return asyncio.run(go())


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
    from trialflow.inspection import attempt_view, result_view
    from trialflow.storage import load_attempt, open_store, trial_result_key

    settings = settings_from_flags(temporal=temporal, s3=s3, store_dir=store_dir)
    batch_id = batch_id or _trial_batch(settings, trial_id)
    store = open_store(settings)
    result = TrialResult.model_validate_json(store.get_bytes(trial_result_key(batch_id, trial_id)))
    console.print(result_view(result))
    for record in result.attempt_records:
        console.print(attempt_view(load_attempt(store, record)))


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

    settings = settings_from_flags(s3=s3, store_dir=store_dir)
    results = batch_results(open_store(settings), batch_id)
    if not results:
        console.print(f"no results stored for batch {batch_id}")
        raise typer.Exit(1)
    path = write_report(out, results, title=f"batch {batch_id}")
    console.print(f"{len(results)} trials -> {path}")
