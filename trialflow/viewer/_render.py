"""The viewer's pages as pure functions: view models in, one HTML string out.

Everything that came from a trial (token text, tool calls, logs, ids, error messages) is
agent-controlled and goes through `esc` (html.escape, quotes too) and nowhere else; attribute
values are escaped the same way. The pages carry no script at all and load nothing from
outside (styles inline), and the server adds a Content-Security-Policy that forbids scripts,
so even a missed escape could not run one. Sizes are bounded: `PAGE_TOKENS` tokens per token
view (the rest one link away, paged), `TURNS_SHOWN` turns per attempt table, `TEXT_CHARS` per
answer text or tool call, logs already cut to their tail by `_data`.

Colours: prompt tokens grey; mask 0 (environment: tool output and template text the model did
not generate, not trained on) blue; mask 1 (generated, trained on) from red (logprob low) to
green (near 0): hue 120 * p where p = exp(logprob).
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Callable, Sequence
from typing import Any

from proxy.trajectory import Segment, Trajectory, TurnRecord
from trialflow.display import reward_text, strip_ansi, why
from trialflow.viewer._data import BatchEntry, BatchPage, LogText, TrialPage, UnitView
from trialflow.viewer._urls import batch_url, segment_url, trial_url, turn_url, workflow_ui_url
from workflows.shared import TrialResult

PAGE_TOKENS = 2000
TURNS_SHOWN = 500
TEXT_CHARS = 64 << 10
Decode = Callable[[int], str] | None

_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:16px 24px;color:#1d2430;background:#fff}
a{color:#1f5fbf}table{border-collapse:collapse;margin:8px 0}
td,th{border:1px solid #d5dae3;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#eef1f6}pre{background:#f6f7f9;border:1px solid #d5dae3;padding:8px;
white-space:pre-wrap;word-break:break-all;max-height:480px;overflow:auto}
.nav{margin-bottom:12px;color:#5a6475}.note{color:#7a4a00;background:#fff6e0;padding:4px 8px}
.err{color:#a11;background:#fde8e8;padding:6px 10px;border:1px solid #f3b4b4}
.badge{display:inline-block;padding:1px 7px;border-radius:9px;font-size:12px;color:#fff}
.generated{background:#2a7d3b}.replayed{background:#7a3fb0}
.tok{font:13px/1.9 ui-monospace,monospace;white-space:pre-wrap;word-break:break-all;
border:1px solid #d5dae3;padding:8px}
.tok span{border-radius:2px;margin:0 1px 0 0}
.tp{background:#e4e4e4}.te{background:#b8cdf5}
.turnmark{font:11px sans-serif;background:#1d2430;color:#fff;padding:0 4px;margin:0 3px}
.add{color:#136b1f;background:#e6f6e8}.del{color:#9b1c1c;background:#fbe9e9}
.legend span{padding:1px 6px;margin-right:6px}
"""


def esc(value: Any) -> str:
    """The one escape for anything shown (text and attribute values alike)."""
    return html.escape(str(value), quote=True)


def page(title: str, body: str, nav: Sequence[tuple[str, str]] = ()) -> str:
    crumbs = " / ".join(f'<a href="{esc(href)}">{esc(text)}</a>' for href, text in [("/", "batches"), *nav])
    return (
        '<!doctype html><html><head><meta charset="utf-8">'
        f"<title>{esc(title)} · trialflow</title><style>{_CSS}</style></head>"
        f'<body><div class="nav">{crumbs}</div><h1>{esc(title)}</h1>{body}</body></html>'
    )


def error_page(message: str, status: int) -> str:
    return page(f"error {status}", f'<p class="err" id="error">{esc(message)}</p>')


def _table(header: Sequence[str] | None, rows: Sequence[Sequence[str]], id_: str = "", cls: str = "") -> str:
    """``rows`` cells are HTML already (escaped by their makers); ``header`` None: a
    field/value table (each row's first cell is its heading). ``id_`` for a page's one such
    table, ``cls`` for one per attempt."""

    def cell(i: int, html_: str) -> str:
        return f"<th>{html_}</th>" if header is None and i == 0 else f"<td>{html_}</td>"

    head = "" if header is None else "<tr>" + "".join(f"<th>{esc(h)}</th>" for h in header) + "</tr>"
    body = "".join("<tr>" + "".join(cell(i, c) for i, c in enumerate(row)) + "</tr>" for row in rows)
    ident = (f' id="{esc(id_)}"' if id_ else "") + (f' class="{esc(cls)}"' if cls else "")
    return f"<table{ident}>{head}{body}</table>"


def _link(href: str, text: Any) -> str:
    return f'<a href="{esc(href)}">{esc(text)}</a>'


def _badge(source: str) -> str:
    return f'<span class="badge {esc(source)}">{esc(source)}</span>'


# ---------------------------------------------------------------------------- index and batch


def index_page(batches: Sequence[BatchEntry], where: str, total: int, offset: int, per_page: int) -> str:
    rows = [[_link(batch_url(b.batch_id), b.batch_id), esc(b.trials)] for b in batches]
    body = f"<p>store: {esc(where)}</p>"
    if not rows:
        return page("batches", body + "<p>no batches here</p>")
    body += f"<p>batches {offset + 1}-{offset + len(rows)} of {total}</p>" + _table(
        ["batch", "trials"], rows, "batches"
    )
    if offset + per_page < total:
        body += _link(f"/?offset={offset + per_page}", "next batches")
    return page("batches", body)


def batch_page(p: BatchPage, per_page: int) -> str:
    rows = []
    for row in p.rows:
        r = row.result
        if r is None:
            rows.append([esc(row.trial_id), f'<span class="err">{esc(row.error)}</span>', *[""] * 6])
            continue
        rows.append([
            _link(trial_url(r.trial_id, batch_id=p.batch_id), r.trial_id), esc(r.task_name), esc(r.scaffold),
            esc(reward_text(r)), esc(r.termination_reason), esc(r.attempts),
            esc(f"{r.replayed_turns} / {r.generated_turns}"), esc(why(r)),
        ])  # fmt: skip
    header = ["trial", "task", "scaffold", "reward", "termination", "attempts", "replayed / generated", "why"]
    more = ""
    if p.offset + per_page < p.total:
        more = _link(f"{batch_url(p.batch_id)}?offset={p.offset + per_page}", "next trials")
    shown = f"<p>trials {p.offset + 1}-{p.offset + len(p.rows)} of {p.total}</p>"
    return page(f"batch {p.batch_id}", shown + _table(header, rows, "trials") + more)


# ---------------------------------------------------------------------------- trial


def trial_page(tp: TrialPage, temporal_ui: str, namespace: str) -> str:
    r = tp.result
    ui = workflow_ui_url(r.trial_id, temporal_ui, namespace)
    body = [
        f'<p><a id="temporal-link" href="{esc(ui)}">this trial in the Temporal UI</a></p>',
        _summary(r),
        _steps(r),
        _replay_reports(tp.replays),
    ]
    for view in tp.units:
        body.append(_unit(r, view))
    return page(f"trial {r.trial_id}", "".join(body), [(batch_url(r.batch_id), f"batch {r.batch_id}")])


def _summary(r: TrialResult) -> str:
    error = ""
    if r.error is not None:
        error = (
            f"{r.error.type} in {r.error.phase} (attempt {r.error.attempt}): {strip_ansi(r.error.message)}"
        )
    rows = [
        ("task / scaffold", f"{r.task_name} / {r.scaffold} (sample {r.sample_index})"),
        ("reward", reward_text(r)),
        ("reward error", strip_ansi(r.reward_error or "")),
        ("termination", r.termination_reason),
        ("error", error),
        ("attempts", str(r.attempts)),
        ("turns: replayed / generated", f"{r.turns}: {r.replayed_turns} / {r.generated_turns}"),
        ("tool calls", str(r.tool_calls)),
        ("tokens prompt / response", f"{r.prompt_tokens} / {r.response_tokens}"),
        ("verifier", r.verifier_trust or ""),
        ("timings s", "  ".join(f"{k} {v:.1f}" for k, v in r.timings.items())),
    ]
    return _table(None, [[esc(k), esc(v)] for k, v in rows if v], "summary")


def _steps(r: TrialResult) -> str:
    if not r.step_results:
        return ""
    rows = [
        [esc(s.name), esc(reward_text(s)), esc(s.termination_reason or "set-up failed"), esc(s.turns),
         esc(strip_ansi(s.reward_error or "")), esc(s.stopped or "")]
        for s in r.step_results
    ]  # fmt: skip
    return "<h2>steps</h2>" + _table(
        ["step", "reward", "ended", "turns", "reward error", "stopped"], rows, "steps"
    )


def _replay_reports(reports: Sequence[dict[str, Any]]) -> str:
    if not reports:
        return ""
    parts = ["<h2>re-runs from the record</h2>"]
    for rep in reports:
        if "error" in rep:
            parts.append(f'<p class="err">{esc(rep.get("name", ""))}: {esc(rep["error"])}</p>')
            continue
        verdict = (
            "reproduced"
            if rep.get("reproduced")
            else "diverged"
            if rep.get("divergence")
            else "not reproduced"
        )
        parts.append(
            f'<div class="replay"><p>attempt {esc(rep.get("attempt"))} at {esc(rep.get("created", ""))}: '
            f"<b>{esc(verdict)}</b>, replayed {esc(rep.get('replayed'))} of "
            f"{esc(rep.get('replayable_turns'))} recorded turns</p>"
        )
        if rep.get("diff"):
            parts.append(diff_block(str(rep["diff"])))
        parts.append("</div>")
    return "".join(parts)


def diff_block(diff: str) -> str:
    """A divergence account (proxy.replay.describe) with its diff lines coloured."""
    lines = []
    for line in diff.splitlines():
        cls = "add" if line.startswith("+") and not line.startswith("+++") else ""
        cls = "del" if line.startswith("-") and not line.startswith("---") else cls
        lines.append(f'<span class="{cls}">{esc(line)}</span>' if cls else esc(line))
    return '<pre class="diff">' + "\n".join(lines) + "</pre>"


def segment_reason(trajectory: Trajectory, index: int) -> str:
    """Why segment ``index`` began, in words (proxy.tokenization rule 4)."""
    seg = trajectory.segments[index]
    if seg.cause == "client":
        return "the client rewrote its history (compaction, an edited or dropped message, changed tools)"
    if seg.cause == "template":
        return "the conversation went on, but the chat template re-rendered it, so it could not extend"
    if seg.kind == "side":
        return "a side request (another system prompt, or no tools: title, quota, summary) no side segment extends"
    if seg.rewritten:
        return "a new main segment (rewritten; a record written before causes were kept)"
    return "the main thread's first request"


def _unit(r: TrialResult, view: UnitView) -> str:
    u, loaded = view.unit, view.loaded
    anchor = f"a{u.attempt}" + (f"-{u.step}" if u.step else "")
    head = f'<h2 id="{esc(anchor)}">{esc(u.label)}</h2>'
    parts = [head]
    traj = loaded.trajectory
    if traj is None:
        why_none = loaded.error or (
            "a model-free scaffold" if loaded.record.complete else "lost before its first turn"
        )
        parts.append(f"<p>no trajectory: {esc(why_none)}</p>")
    else:
        if loaded.partial:
            parts.append(f'<p class="note">lost attempt: rebuilt from {loaded.checkpoints} checkpoints</p>')
        resume = traj.metadata.get("replay")
        if isinstance(resume, dict):
            parts.append(_resume_note(resume))
        parts.append(_segments_table(r, u, traj))
        parts.append(_turns_table(r, u, traj))
    for name, log in view.logs.items():
        parts.append(_log_block(name, log))
    if view.logs_left_out:
        names = ", ".join(view.logs_left_out[:50]) + (" ..." if len(view.logs_left_out) > 50 else "")
        parts.append(f'<p class="note">{len(view.logs_left_out)} more log files not shown: {esc(names)}</p>')
    return "".join(parts)


def _resume_note(status: dict[str, Any]) -> str:
    div = status.get("divergence")
    text = f"resumed: replayed {status.get('replayed')} of {status.get('replayable_turns')} recorded turns"
    if isinstance(div, dict):
        text += (
            f"; live from turn {_one_based(div.get('turn'))} on ({div.get('reason')}"
            + (
                f", first differing prompt token {div['first_diff_token']}"
                if div.get("first_diff_token") is not None
                else ""
            )
            + ")"
        )
    return f'<p class="note resume">{esc(text)}</p>'


def _one_based(index: Any) -> Any:
    """A divergence's request index (proxy.replay counts from 0) as this viewer's turn number."""
    return index + 1 if isinstance(index, int) else index


def _segments_table(r: TrialResult, u: Any, traj: Trajectory) -> str:
    rows = []
    for i, seg in enumerate(traj.segments):
        model = seg.response_mask.count(1)
        href = segment_url(r.trial_id, i, batch_id=r.batch_id, attempt=u.attempt, step=u.step)
        rows.append([
            _link(href, i), esc(seg.kind), esc(segment_reason(traj, i)), esc(len(seg.prompt_ids)),
            esc(model), esc(len(seg.response_mask) - model),
        ])  # fmt: skip
    return "<h3>segments</h3>" + _table(
        ["segment", "kind", "why it began", "prompt", "model (mask 1)", "env (mask 0)"], rows, cls="segments"
    )


def _tool_names(turn: TurnRecord) -> str:
    calls = (turn.answer or {}).get("tool_calls") or []
    return ", ".join(str(c.get("name", "?")) for c in calls) if calls else str(turn.tool_calls or "")


def _turns_table(r: TrialResult, u: Any, traj: Trajectory) -> str:
    rows = []
    for n, turn in enumerate(traj.turns[:TURNS_SHOWN], start=1):
        href = turn_url(r.trial_id, n, batch_id=r.batch_id, attempt=u.attempt, step=u.step)
        rows.append([
            _link(href, n), _badge(turn.source), esc(turn.segment), esc(turn.prompt_tokens),
            esc(turn.completion_tokens), esc(turn.env_tokens_added),
            esc(turn.finish_reason + (" (overlong)" if turn.overlong else "")), esc(_tool_names(turn)),
            esc(f"{turn.latency_s:.2f}"), esc(turn.replica),
        ])  # fmt: skip
    note = ""
    if len(traj.turns) > TURNS_SHOWN:
        note = f'<p class="note">first {TURNS_SHOWN} of {len(traj.turns)} turns shown; later ones by turn page</p>'
    header = [
        "turn",
        "source",
        "segment",
        "prompt",
        "completion",
        "env",
        "finish",
        "tool calls",
        "latency s",
        "replica",
    ]
    return "<h3>turns</h3>" + _table(header, rows, cls="turns") + note


def _log_block(name: str, log: LogText) -> str:
    cut = f'<p class="note">{log.cut} earlier bytes left out</p>' if log.cut else ""
    text = strip_ansi(log.text)
    return (
        f'<details class="log" open><summary>{esc(name)}</summary>{cut}'
        f'<pre data-log="{esc(name)}">{esc(text) or "(empty)"}</pre></details>'
    )


# ---------------------------------------------------------------------------- tokens


def token_spans(
    seg: Segment, start: int, stop: int, decode: Decode, marks: dict[int, str] | None = None
) -> str:
    """Positions ``start``..``stop`` of ``seg``'s full sequence as coloured spans; ``marks``:
    labels to put before a position (turn starts)."""
    n_prompt = len(seg.prompt_ids)
    out = []
    for pos in range(start, stop):
        if marks and pos in marks:
            out.append(f'<span class="turnmark">{esc(marks[pos])}</span>')
        if pos < n_prompt:
            tid, cls, style, title = seg.prompt_ids[pos], "tp", "", f"prompt #{pos} id {seg.prompt_ids[pos]}"
            mask = ""
        else:
            r = pos - n_prompt
            tid, m, lp = seg.response_ids[r], seg.response_mask[r], seg.response_logprobs[r]
            mask = str(m)
            title = f"#{pos} id {tid} mask {m}" + (f" logprob {lp:.4f}" if m else "")
            if m:
                cls, style = "tg", f' style="background:{logprob_colour(lp)}"'
            else:
                cls, style = "te", ""
        text = _token_text(tid, decode)
        attrs = f' data-mask="{mask}"' if mask else ""
        out.append(f'<span class="{cls}"{style}{attrs} title="{esc(title)}">{esc(text)}</span>')
    return "".join(out)


def logprob_colour(logprob: float) -> str:
    p = math.exp(min(0.0, logprob)) if math.isfinite(logprob) else 0.0
    return f"hsl({round(120 * p)},75%,72%)"


def _token_text(tid: int, decode: Decode) -> str:
    if decode is None:
        return f"[{tid}]"
    text = decode(tid)
    if text == "":
        return f"[{tid}]"
    return text.replace("\n", "↵\n")


def _legend() -> str:
    return (
        '<p class="legend"><span class="tp">prompt</span><span class="te">mask 0: environment (not trained)</span>'
        f'<span style="background:{logprob_colour(-5)}">mask 1: generated, logprob low</span>'
        f'<span style="background:{logprob_colour(0)}">mask 1: logprob near 0</span></p>'
    )


def turn_page(r: TrialResult, u: Any, traj: Trajectory, n: int, decode: Decode) -> str:
    """Turn ``n`` (from 1): its answer, tool calls, the environment tokens that preceded it,
    and its generated tokens (each at most `PAGE_TOKENS`; the segment page has the rest)."""
    turn = traj.turns[n - 1]
    title = f"turn {n} of {r.trial_id} ({u.label})"
    nav = [
        (batch_url(r.batch_id), f"batch {r.batch_id}"),
        (trial_url(r.trial_id, batch_id=r.batch_id), r.trial_id),
    ]
    if not 0 <= turn.segment < len(traj.segments):
        return page(
            title, f'<p class="err">turn {n} names segment {turn.segment}, which the record lacks</p>', nav
        )
    seg = traj.segments[turn.segment]
    seg_href = segment_url(r.trial_id, turn.segment, batch_id=r.batch_id, attempt=u.attempt, step=u.step)
    facts = [
        ("source", _badge(turn.source)),
        ("segment", _link(seg_href, f"{turn.segment} ({seg.kind})")),
        ("finish", esc(turn.finish_reason + (" (overlong)" if turn.overlong else ""))),
        ("tokens prompt / completion / env", esc(f"{turn.prompt_tokens} / {turn.completion_tokens} / {turn.env_tokens_added}")),
        ("replica / latency", esc(f"{turn.replica or '-'} / {turn.latency_s:.2f} s")),
        ("policy version", esc("" if turn.policy_version is None else f"{turn.policy_version}..{turn.policy_version_end}")),
        ("parse failures", esc(turn.parse_failures)),
    ]  # fmt: skip
    body = [_table(None, [[esc(k), v] for k, v in facts], "turn")]
    body.append(_answer(turn))
    body.append("<h2>tokens</h2>" + _legend())
    gen_start = turn.prompt_tokens
    env_start = gen_start - turn.env_tokens_added
    if turn.env_tokens_added:
        body.append(f"<h3>environment before it ({turn.env_tokens_added} tokens, mask 0)</h3>")
        body.append(_token_box(seg, env_start, gen_start, decode, "env"))
        head_note = f"prompt tokens 0-{env_start - 1}: earlier turns"
    else:
        lo = max(0, gen_start - PAGE_TOKENS)
        body.append(f"<h3>prompt ({gen_start} tokens{', its last ' + str(PAGE_TOKENS) if lo else ''})</h3>")
        body.append(_token_box(seg, lo, gen_start, decode, "prompt"))
        head_note = f"prompt tokens 0-{lo - 1}" if lo else ""
    if head_note:
        body.append(f"<p>{esc(head_note)}: {_link(seg_href, 'the whole segment')}</p>")
    stop = min(gen_start + turn.completion_tokens, len(seg), gen_start + PAGE_TOKENS)
    body.append(f"<h3>generated ({turn.completion_tokens} tokens, mask 1)</h3>")
    body.append(_token_box(seg, gen_start, stop, decode, "generated"))
    if stop < gen_start + turn.completion_tokens:
        more = segment_url(
            r.trial_id, turn.segment, batch_id=r.batch_id, attempt=u.attempt, step=u.step, offset=stop
        )
        body.append(f'<p class="note">first {PAGE_TOKENS} shown: {_link(more, "the rest")}</p>')
    nav.append((f"{trial_url(r.trial_id, batch_id=r.batch_id)}", u.label))
    return page(title, "".join(body), nav)


def _token_box(
    seg: Segment, start: int, stop: int, decode: Decode, ident: str, marks: dict[int, str] | None = None
) -> str:
    return f'<div class="tok" id="{esc(ident)}">{token_spans(seg, start, stop, decode, marks)}</div>'


def _answer(turn: TurnRecord) -> str:
    a = turn.answer
    if a is None:
        return "<p>no answer kept (a record written before answers were kept)</p>"
    parts = ["<h2>answer</h2>"]
    if a.get("reasoning"):
        parts.append(f'<h3>reasoning</h3><pre id="reasoning">{esc(_capped(a["reasoning"]))}</pre>')
    parts.append(f'<h3>content</h3><pre id="content">{esc(_capped(a.get("content") or "(none)"))}</pre>')
    calls = a.get("tool_calls") or []
    if calls:
        rows = [
            [
                esc(c.get("id", "")),
                esc(c.get("name", "")),
                f"<pre>{esc(_capped(_pretty(c.get('arguments'))))}</pre>",
            ]
            for c in calls
        ]
        parts.append("<h3>tool calls</h3>" + _table(["id", "name", "arguments"], rows, "tool-calls"))
    return "".join(parts)


def _capped(text: Any) -> str:
    """An answer's text at most `TEXT_CHARS` characters (a turn can generate megabytes)."""
    text = str(text)
    if len(text) <= TEXT_CHARS:
        return text
    return (
        text[:TEXT_CHARS]
        + f"\n[... {len(text) - TEXT_CHARS} more characters; every token is on the segment page]"
    )


def _pretty(arguments: Any) -> str:
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return arguments
    return json.dumps(arguments, indent=2, ensure_ascii=False)


def segment_page(r: TrialResult, u: Any, traj: Trajectory, index: int, offset: int, decode: Decode) -> str:
    """Segment ``index``'s tokens from ``offset``, `PAGE_TOKENS` a page, turn starts marked."""
    seg = traj.segments[index]
    total = len(seg)
    offset = max(0, min(offset, max(0, total - 1)))
    stop = min(total, offset + PAGE_TOKENS)
    marks = {t.prompt_tokens: f"turn {n}" for n, t in enumerate(traj.turns, start=1) if t.segment == index}
    nav = [
        (batch_url(r.batch_id), f"batch {r.batch_id}"),
        (trial_url(r.trial_id, batch_id=r.batch_id), r.trial_id),
    ]

    def at(off: int) -> str:
        return segment_url(r.trial_id, index, batch_id=r.batch_id, attempt=u.attempt, step=u.step, offset=off)

    pager = []
    if offset > 0:
        pager.append(_link(at(max(0, offset - PAGE_TOKENS)), "previous tokens"))
    if stop < total:
        pager.append(_link(at(stop), "next tokens"))
    body = (
        f"<p>{esc(segment_reason(traj, index))}. Tokens {offset}-{stop - 1} of {total} "
        f"(prompt {len(seg.prompt_ids)}).</p>" + _legend() + " ".join(pager)
        + _token_box(seg, offset, stop, decode, "segment", marks) + " ".join(pager)
    )  # fmt: skip
    return page(f"segment {index} of {r.trial_id} ({u.label})", body, nav)
