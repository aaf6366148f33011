"""Rich views of trials for the terminal: the live progress bar and the result tables."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from trialflow.admission import AdmissionReport
from trialflow.batch import TrialStatus
from trialflow.display import mean_valid, reward_text, steps_text, why
from workflows.shared import TrialResult


@contextlib.contextmanager
def trial_progress(console: Console, title: str, total: int) -> Iterator[Callable[[TrialResult], None]]:
    """A progress bar of `total` trials; yields the callback that counts one finished trial
    (errors so far, mean reward so far). Not on a terminal (a log, a pipe), where a bar
    would show nothing until the end, each finished trial is one line instead."""
    if not console.is_terminal:
        done: list[TrialResult] = []

        def on_line(result: TrialResult) -> None:
            done.append(result)
            mean, invalid = mean_valid(done)
            console.print(
                f"[{len(done)}/{total}] {result.trial_id}: {reward_text(result)} {result.termination_reason}"
                f" ({sum(result.timings.values()):.1f} s)"
                f"{' · ' + why(result) if why(result) else ''}"
                f" · errors {sum(r.failed for r in done)} invalid {invalid}"
                f" mean reward {'-' if mean is None else f'{mean:.3f}'}",
                highlight=False,
                soft_wrap=True,
            )

        yield on_line
        return
    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn(
            "errors {task.fields[errors]}  invalid {task.fields[invalid]}  mean reward {task.fields[mean]}"
        ),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console) as progress:
        bar = progress.add_task(title, total=total, errors=0, invalid=0, mean="-")
        finished: list[TrialResult] = []

        def on_result(result: TrialResult) -> None:
            finished.append(result)
            mean, invalid = mean_valid(finished)  # an invalid reward is not a 0
            progress.update(
                bar,
                advance=1,
                errors=sum(r.failed for r in finished),
                invalid=invalid,
                mean="-" if mean is None else f"{mean:.3f}",
            )

        yield on_result


def results_table(results: Sequence[TrialResult], title: str = "trials") -> Table:
    """One row per trial, by trial id (what `trialflow inspect` takes; it wraps rather
    than truncates on a narrow terminal). "why" is the trial's error, else why its reward
    is invalid (e.g. the verifier wrote no reward file), in one line (`trialflow.display`)."""
    table = Table(title=title)
    # ids whole where the width allows (what `inspect` takes): the other columns fold first
    table.add_column("trial", overflow="fold", min_width=max((len(r.trial_id) for r in results), default=5))
    for column in ("reward", "termination", "turns", "tokens p/r", "s"):
        table.add_column(column)
    table.add_column("why", overflow="fold", ratio=1)
    for r in results:
        table.add_row(
            r.trial_id,
            "\n".join(filter(None, (reward_text(r), steps_text(r.step_results)))),
            r.termination_reason,
            str(r.turns),
            f"{r.prompt_tokens}/{r.response_tokens}",
            f"{sum(r.timings.values()):.1f}",
            why(r),
        )
    return table


def status_table(trials: Sequence[TrialStatus], title: str) -> Table:
    """A batch's trials as Temporal visibility lists them; with `batch.with_progress`, a
    running trial's phase, attempt, turns and tokens, a finished one's and why it failed."""
    table = Table(title=title)
    table.add_column(
        "workflow", overflow="fold", min_width=max((len(t.workflow_id) for t in trials), default=8)
    )
    for column in ("status", "task", "reward", "termination", "progress"):
        table.add_column(column, overflow="fold")
    table.add_column("why", overflow="fold", ratio=1)
    table.add_column("rerun of", overflow="fold")
    for t in trials:
        reward = "" if t.reward is None else f"{t.reward:.3f}"
        if t.reward_valid is False:
            reward = "invalid"
        elif t.rewards and (len(t.rewards) > 1 or "reward" not in t.rewards):
            reward += " (" + ", ".join(f"{k}={v:g}" for k, v in t.rewards.items()) + ")"
        if t.steps:
            reward += "\n" + steps_text(t.steps)
        table.add_row(
            t.workflow_id,
            t.status,
            t.task or "",
            reward,
            t.termination or "",
            progress_text(t),
            why(t.result) if t.result is not None else "",
            t.replay_of or "",
        )
    return table


def admission_table(reports: Sequence[AdmissionReport]) -> Table:
    """One row per worker: its admission limits (in use / limit, the ceiling), what binds
    them, and the age of the report (a stale one is from a worker gone without a word)."""
    table = Table(title="admission (per worker)")
    for column in ("worker", "mode", "sandboxes", "model phase", "ceiling", "binding", "age s"):
        table.add_column(column, overflow="fold")
    now = datetime.now(UTC)
    for r in reports:
        age = (now - r.updated_at).total_seconds()
        table.add_row(
            r.worker_id,
            r.mode,
            f"{r.sandboxes_in_use}/{r.sandbox_limit}",
            f"{r.model_phase}/{r.model_limit}"
            + (f" (+{r.model_waiting} waiting)" if r.model_waiting else ""),
            str(r.ceiling),
            r.binding,
            f"{age:.0f}" + (" (stale)" if r.stale(now) else ""),
        )
    return table


def progress_text(t: TrialStatus) -> str:
    """A running trial's phase, attempt, turns and tokens; a finished one's turns, tokens and
    attempts; "" when neither is known (no worker answered, or not fetched)."""
    if t.progress is not None:
        p = t.progress
        text = f"{p.phase} · attempt {p.attempt}" if p.attempt else p.phase
        if p.turns:
            text += f" · {p.turns} turns · {p.prompt_tokens}/{p.response_tokens} tokens"
        return text
    if t.result is not None:
        r = t.result
        return (
            f"{r.turns} turns ({r.replayed_turns} replayed) · {r.prompt_tokens}/{r.response_tokens} tokens"
            f" · {r.attempts} attempt{'s' if r.attempts != 1 else ''}"
        )
    if t.status == "RUNNING":
        return "no worker answers its progress query"
    return ""
