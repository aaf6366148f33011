"""`replay TRIAL --from-record`: the trial's scaffold against its record, no replica
(trialflow.record_replay does the work; this resolves the trial and prints the report)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from rich.markup import escape

from trialflow import batch
from trialflow.cli._app import console
from trialflow.cluster import connect_temporal
from trialflow.settings import TrialflowSettings
from workflows.shared import TrialResult


def replay_record(
    settings: TrialflowSettings, trial_id: str, *, attempt: int | None, task: Path | None
) -> int:
    """Exit code: 0 reproduced (no divergence), 1 diverged or nothing to replay."""
    if settings.model_dir is None:
        console.print(
            "[red]--from-record needs --model-dir[/]: the tokenizer and chat template render the prompts"
        )
        return 1
    return asyncio.run(_replay(settings, trial_id, attempt, task))


async def _replay(settings: TrialflowSettings, trial_id: str, attempt: int | None, task: Path | None) -> int:
    from proxy.parsers import use_vocabulary
    from proxy.server import ProxyServer
    from proxy.session import SessionConfig
    from trialflow.record_replay import replay_from_record
    from trialflow.sandbox.registry import open_backend
    from trialflow.storage import load_attempt, open_store, trial_result_key

    client = await connect_temporal(settings)
    spec = await batch.spec_of(client, trial_id)
    store = open_store(settings)
    result = TrialResult.model_validate_json(store.get_bytes(trial_result_key(spec.batch_id, trial_id)))
    records = result.attempt_records
    record = (
        records[attempt - 1] if attempt is not None and 0 < attempt <= len(records) else result.last_attempt
    )
    if record is None or (attempt is not None and record.attempt != attempt):
        console.print(f"[red]{trial_id} has no attempt {attempt or ''} with a record[/]")
        return 1
    loaded = await asyncio.to_thread(load_attempt, store, record)
    if loaded.trajectory is None:
        console.print(
            f"[red]attempt {record.attempt} of {trial_id} left no trajectory[/]: "
            f"{loaded.error or 'no model session'}"
        )
        return 1
    console.print(
        f"re-running {trial_id} attempt {record.attempt} against its record ({loaded.source} trajectory, "
        f"{loaded.trajectory.counters.turns} turns) without a replica"
    )
    use_vocabulary(settings.harmony_vocab_dir)  # gpt-oss's harmony parser, before the server makes it
    proxy = ProxyServer(
        model_dir=settings.model_dir,
        defaults=SessionConfig(model=spec.model or settings.model_name),
        profile=settings.model_profile,
    )
    backend = open_backend(settings, labels={"trialflow.replay": "from-record"})  # the workers' kind
    await proxy.start()
    try:
        report = await replay_from_record(
            trial_id=trial_id,
            trajectory=loaded.trajectory,
            task_path=task or spec.task_path,
            scaffold=spec.scaffold,
            scaffold_options=spec.scaffold_options,
            backend=backend,
            proxy=proxy,
            session_config=proxy.defaults,
        )
    finally:
        await proxy.stop()
        backend.close()
    console.print(escape(report.summary()))
    key = _keep_report(store, spec.batch_id, record.attempt, report)
    console.print(f"report kept in the store: {escape(key)} (trialflow view shows it on the trial's page)")
    return 0 if report.reproduced else 1


def _keep_report(store, batch_id: str, attempt: int, report) -> str:
    """The report as JSON beside the trial's result (`storage.record_replay_key`), so the
    viewer shows every re-run's divergence with its diff."""
    import json
    from datetime import UTC, datetime

    from trialflow.storage import record_replay_key

    now = datetime.now(UTC)
    key = record_replay_key(batch_id, report.trial_id, f"attempt-{attempt}-{now:%Y%m%dT%H%M%S%fZ}")
    body = {
        "attempt": attempt,
        "created": now.isoformat(timespec="seconds"),
        "recorded_turns": report.recorded_turns,
        "replayable_turns": report.replayable_turns,
        "replayed": report.replayed,
        "unused": report.unused,
        "reproduced": report.reproduced,
        "divergence": None if report.divergence is None else report.divergence.summary(),
        "diff": report.diff,
        "summary": report.summary(),
        "scaffold_exit_code": report.scaffold.exit_code,
        "seconds": round(report.seconds, 3),
    }
    store.put_bytes(key, json.dumps(body, indent=1).encode(), "application/json")
    return key
