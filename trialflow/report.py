"""A small self-contained HTML report for one batch of trials (pure: results in, text out).

``render_report(results, title=...)`` -> one HTML document: plain HTML, inline CSS and
inline SVG, no scripts, no external resources, so it can be opened from S3 or attached
to a CI run as it is. ``write_report(path, results, ...)`` writes it.

Sections: summary (trials, valid rewards, mean reward over valid ones, solved = reward >= 1),
reward histogram (valid rewards, 10 bins over [0, 1]; values outside are clipped into
the end bins), phase-time distribution per phase (min / quartiles / max as a box plot
plus a table), failure reasons (termination reasons, error types with one example trial,
reward errors), per-task summary, the tasks skipped before submit (when any), and every trial.

Edge cases: an empty batch renders every section with "no trials"; a phase missing from a
trial's timings is left out of that phase's statistics (not counted as 0); every string
from a result (error messages, task names) is HTML-escaped.
"""

from __future__ import annotations

import html
import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from pathlib import Path

from trialflow.display import reward_text, steps_text, strip_ansi, why
from workflows.shared import TrialError, TrialResult

PHASES = ("setup", "scaffold", "verify", "teardown")
_CSS = """body{font-family:system-ui,sans-serif;margin:2em;color:#222}table{border-collapse:collapse;margin:.5em 0 1.5em}
td,th{border:1px solid #ccc;padding:.2em .6em;text-align:left;font-size:.9em}th{background:#f3f3f3}
.num{text-align:right;font-variant-numeric:tabular-nums}.bad{color:#b00}svg{display:block;margin:.5em 0 1.5em}"""


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _table(
    head: Sequence[str], rows: Iterable[Sequence[object]], numeric: AbstractSet[int] = frozenset()
) -> str:
    body = "".join(
        "<tr>"
        + "".join(
            f'<td class="num">{_e(c)}</td>' if i in numeric else f"<td>{_e(c)}</td>" for i, c in enumerate(r)
        )
        + "</tr>"
        for r in rows
    )
    return (
        "<table><tr>"
        + "".join(f"<th>{_e(h)}</th>" for h in head)
        + f"</tr>{body or _empty_row(len(head))}</table>"
    )


def _empty_row(cols: int) -> str:
    return f'<tr><td colspan="{cols}">no trials</td></tr>'


def _quartiles(values: Sequence[float]) -> tuple[float, float, float, float, float]:
    v = sorted(values)
    if len(v) == 1:
        return (v[0],) * 5
    q1, med, q3 = statistics.quantiles(v, n=4, method="inclusive")
    return v[0], q1, med, q3, v[-1]


def reward_histogram_svg(
    rewards: Sequence[float], bins: int = 10, width: int = 420, height: int = 140
) -> str:
    """Bar chart of rewards over [0, 1]; bar labels are counts."""
    counts = [0] * bins
    for r in rewards:
        counts[min(bins - 1, max(0, int(r * bins)))] += 1
    top = max(counts) or 1
    bw, plot_h = width / bins, height - 30
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
        f'aria-label="reward histogram">'
    ]
    for i, c in enumerate(counts):
        h = plot_h * c / top
        x = i * bw
        parts.append(
            f'<rect x="{x + 2:.1f}" y="{plot_h - h + 10:.1f}" width="{bw - 4:.1f}" height="{h:.1f}" fill="#4a7"/>'
        )
        if c:
            parts.append(
                f'<text x="{x + bw / 2:.1f}" y="{plot_h - h + 6:.1f}" font-size="10" text-anchor="middle">{c}</text>'
            )
    parts.append(f'<text x="0" y="{height - 4}" font-size="10">0</text>')
    parts.append(f'<text x="{width}" y="{height - 4}" font-size="10" text-anchor="end">1</text>')
    parts.append("</svg>")
    return "".join(parts)


def phase_boxplot_svg(timings: dict[str, list[float]], width: int = 420) -> str:
    """One horizontal box (min, quartiles, max) per phase on a shared seconds axis."""
    phases = [p for p in timings if timings[p]]
    row_h, left = 24, 70
    height = row_h * max(1, len(phases)) + 24
    top = max((max(timings[p]) for p in phases), default=1.0) or 1.0
    sx = lambda s: left + (width - left - 10) * s / top  # noqa: E731
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
        f'aria-label="phase times">'
    ]
    for i, p in enumerate(phases):
        lo, q1, med, q3, hi = _quartiles(timings[p])
        y = i * row_h + 6
        parts.append(f'<text x="0" y="{y + 12}" font-size="11">{_e(p)}</text>')
        parts.append(f'<line x1="{sx(lo):.1f}" x2="{sx(hi):.1f}" y1="{y + 8}" y2="{y + 8}" stroke="#555"/>')
        parts.append(
            f'<rect x="{sx(q1):.1f}" y="{y}" width="{max(1.0, sx(q3) - sx(q1)):.1f}" height="16" '
            f'fill="#9bd" stroke="#555"/>'
        )
        parts.append(
            f'<line x1="{sx(med):.1f}" x2="{sx(med):.1f}" y1="{y}" y2="{y + 16}" stroke="#000" stroke-width="2"/>'
        )
    axis_y = height - 6
    parts.append(f'<text x="{left}" y="{axis_y}" font-size="10">0 s</text>')
    parts.append(f'<text x="{width - 10}" y="{axis_y}" font-size="10" text-anchor="end">{top:.1f} s</text>')
    parts.append("</svg>")
    return "".join(parts)


def trajectory_state(result: TrialResult) -> str:
    """The last attempt's trajectory as the trainer gets it (`trialflow.storage.load_attempt`):
    "final", "partial" (a lost attempt: its checkpoints), or "none" (model-free, no attempt)."""
    last = result.last_attempt
    if last is None or (last.complete and last.trajectory_uri is None):
        return "none"
    return "final" if last.complete else "partial"


def render_report(
    results: Sequence[TrialResult],
    title: str = "trialflow batch",
    cancelled: Iterable[str] = (),
    verifier_logs: Mapping[str, Mapping[str, str]] | None = None,
    skipped: Mapping[str, Sequence[str]] | None = None,
) -> str:
    """The whole report as one HTML string. ``cancelled``: trial ids a straggler policy cut.
    ``verifier_logs``: trial id -> file name -> text (`trialflow.inspection.verifier_logs`),
    shown per trial as collapsed sections. ``skipped``: task directory -> its problems, the
    tasks `run --skip-invalid` left out before submitting (`inspection.batch_skipped`)."""
    cut = set(cancelled)
    valid = [r for r in results if r.reward_valid]
    rewards = [r.reward for r in valid]
    timings: dict[str, list[float]] = {p: [] for p in PHASES}
    for r in results:
        for phase, seconds in r.timings.items():
            timings.setdefault(phase, []).append(seconds)
    summary = [
        ("trials", len(results)),
        ("valid rewards", len(valid)),
        ("mean reward (valid)", f"{statistics.fmean(rewards):.3f}" if rewards else "-"),
        ("solved (reward >= 1)", sum(1 for x in rewards if x >= 1.0)),
        ("cancelled by straggler policy", len(cut)),
        ("tasks skipped before submit", len(skipped or {})),
        ("new segments: client rewrites", sum(r.rewrites_client for r in results)),
        ("new segments: template-forced", sum(r.rewrites_template for r in results)),
    ]
    phase_rows = []
    for p, vals in timings.items():
        if vals:
            lo, q1, med, q3, hi = _quartiles(vals)
            phase_rows.append(
                (p, len(vals), f"{lo:.2f}", f"{q1:.2f}", f"{med:.2f}", f"{q3:.2f}", f"{hi:.2f}")
            )
    terminations = Counter(r.termination_reason for r in results)
    errors: dict[str, list[tuple[str, TrialError]]] = defaultdict(list)  # key -> (trial id, error)
    for r in results:
        if r.error is not None:
            errors[f"{r.error.type} ({r.error.phase})"].append((r.trial_id, r.error))
    reward_errors = Counter(r.reward_error.split(":")[0] for r in results if r.reward_error)
    by_task: dict[str, list[TrialResult]] = defaultdict(list)
    for r in results:
        by_task[r.task_name].append(r)
    task_rows = []
    for task, rs in sorted(by_task.items()):
        vr = [r.reward for r in rs if r.reward_valid]
        task_rows.append((task, len(rs), len(vr), f"{statistics.fmean(vr):.3f}" if vr else "-"))
    trial_rows = [
        (
            r.trial_id,
            r.task_name,
            r.scaffold,
            r.termination_reason + (" (cut)" if r.trial_id in cut else ""),
            " · ".join(filter(None, (reward_text(r), steps_text(r.step_results)))),
            r.turns,
            f"{r.rewrites_client}/{r.rewrites_template}",
            r.prompt_tokens,
            r.response_tokens,
            f"{sum(r.timings.values()):.1f}",
            trajectory_state(r),
            why(r),
        )
        for r in sorted(results, key=lambda r: (r.task_name, r.sample_index, r.trial_id))
    ]
    body = [
        f"<h1>{_e(title)}</h1>",
        _table(("", "value"), summary, numeric={1}),
        "<h2>Rewards</h2>",
        reward_histogram_svg(rewards) if rewards else "<p>no valid rewards</p>",
        "<h2>Phase times (seconds)</h2>",
        phase_boxplot_svg(timings) if phase_rows else "",
        _table(("phase", "n", "min", "p25", "median", "p75", "max"), phase_rows, numeric={1, 2, 3, 4, 5, 6}),
        "<h2>Failure reasons</h2>",
        _table(("termination", "trials"), sorted(terminations.items()), numeric={1}),
        _table(
            ("error", "trials", "example trial", "message"),
            [(k, len(v), v[0][0], strip_ansi(v[0][1].message)[:300]) for k, v in sorted(errors.items())],
            numeric={1},
        ),
        _table(("reward error", "trials"), sorted(reward_errors.items()), numeric={1}),
        "<h2>Tasks</h2>",
        _table(("task", "trials", "valid", "mean reward"), task_rows, numeric={1, 2, 3}),
        *(
            [
                "<h2>Skipped before submit</h2>",
                _table(("task", "problem"), [(t, p) for t, ps in sorted(skipped.items()) for p in ps]),
            ]
            if skipped
            else []
        ),
        "<h2>Trials</h2>",
        _table(
            (
                "trial",
                "task",
                "scaffold",
                "termination",
                "reward",
                "turns",
                "rewrites client/template",
                "prompt tok",
                "response tok",
                "time s",
                "trajectory",
                "error",
            ),
            trial_rows,
            numeric={4, 5, 7, 8, 9},
        ),
    ]
    return (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{_e(title)}</title>'
        f"<style>{_CSS}</style></head><body>{''.join(body)}{_verifier_sections(verifier_logs or {})}"
        "</body></html>\n"
    )


def _verifier_sections(logs: Mapping[str, Mapping[str, str]]) -> str:
    parts = []
    for trial_id, files in sorted(logs.items()):
        if not files:
            continue
        inner = "".join(
            f"<details><summary>{_e(name)}</summary><pre>{_e(strip_ansi(text))}</pre></details>"
            for name, text in files.items()
        )
        parts.append(f"<h3>{_e(trial_id)}</h3>{inner}")
    return "<h2>Verifier output</h2>" + "".join(parts) if parts else ""


def write_report(
    path: str | Path,
    results: Sequence[TrialResult],
    title: str = "trialflow batch",
    cancelled: Iterable[str] = (),
    verifier_logs: Mapping[str, Mapping[str, str]] | None = None,
    skipped: Mapping[str, Sequence[str]] | None = None,
) -> Path:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render_report(results, title, cancelled, verifier_logs, skipped), encoding="utf-8")
    return out
