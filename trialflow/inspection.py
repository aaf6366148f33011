"""What `trialflow inspect` and `trialflow report` show, as pure functions over stored data.

- `trajectory_view(trajectory, title)`: rich renderables of one attempt's trajectory: the
  per-turn table (segment, kind, prompt/completion/env tokens, finish reason, tool calls,
  parse failures, latency, replica), the per-segment table (prompt tokens; response tokens
  split into model tokens = mask 1, trained on, and env tokens = mask 0, masked out; policy
  versions; routed experts) and the counters.
- `result_view(result)`: the trial's rewards, termination, error, timings, each phase's
  network and URIs (a multi-step trial's logs per step).
- `attempt_view(loaded)`: one attempt as `storage.load_attempt` read it (final or partial).
- `batch_results(store, batch_id)`: every trial result stored for a batch;
  `record_skipped` / `batch_skipped`: the tasks `run --skip-invalid` left out, with why.
- `verifier_logs(store, result)`: the verifier's stored output (per step for a multi-step trial).

Edge cases: a trajectory without turns (the agent never called the model, or the attempt
died before its first turn) renders the tables with a "no turns" / "no segments" row; a
turn whose segment index is out of range (a corrupt record) shows kind "?" instead of
raising; a finish reason cut by the context window is marked "(overlong)".
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from proxy.trajectory import Trajectory
from trialflow.display import reward_text, strip_ansi
from trialflow.errors import ObjectNotFound
from trialflow.storage import AttemptRecord, LoadedAttempt, ResultStore, TrialKeys, batch_skipped_key
from trialflow.tasks import step_key
from workflows.shared import StepResult, TrialResult

TURN_COLUMNS = (
    "turn", "segment", "kind", "prompt", "completion", "env", "finish",
    "tool calls", "parse fail", "latency s", "replica",
)  # fmt: skip
SEGMENT_COLUMNS = (
    "segment", "kind", "rewritten", "prompt", "response", "model (mask 1)",
    "env (mask 0)", "policy version", "routed experts",
)  # fmt: skip


def _table(title: str, columns: Sequence[str], numeric: Sequence[str] = ()) -> Table:
    table = Table(title=title, title_justify="left")
    for column in columns:
        table.add_column(column, justify="right" if column in numeric else "left")
    return table


def turn_table(trajectory: Trajectory) -> Table:
    table = _table(
        "turns", TURN_COLUMNS,
        numeric=("turn", "segment", "prompt", "completion", "env", "tool calls", "parse fail", "latency s"),
    )  # fmt: skip
    for i, turn in enumerate(trajectory.turns, start=1):
        in_range = 0 <= turn.segment < len(trajectory.segments)
        kind = trajectory.segments[turn.segment].kind if in_range else "?"
        finish = turn.finish_reason + (" (overlong)" if turn.overlong else "")
        table.add_row(
            str(i), str(turn.segment), kind, str(turn.prompt_tokens), str(turn.completion_tokens),
            str(turn.env_tokens_added), finish, str(turn.tool_calls), str(turn.parse_failures),
            f"{turn.latency_s:.2f}", turn.replica,
        )  # fmt: skip
    if not trajectory.turns:
        table.add_row("no turns", *[""] * (len(TURN_COLUMNS) - 1))
    return table


def mask_counts(trajectory: Trajectory) -> list[tuple[int, int]]:
    """(model tokens, env tokens) per segment: response tokens with mask 1 and mask 0."""
    counts = []
    for seg in trajectory.segments:
        model = seg.response_mask.count(1)
        counts.append((model, len(seg.response_mask) - model))
    return counts


def segment_table(trajectory: Trajectory) -> Table:
    table = _table(
        "segments", SEGMENT_COLUMNS,
        numeric=("segment", "prompt", "response", "model (mask 1)", "env (mask 0)"),
    )  # fmt: skip
    for i, (seg, (model, env)) in enumerate(zip(trajectory.segments, mask_counts(trajectory), strict=True)):
        versions = (
            "" if seg.policy_version_min is None
            else f"{seg.policy_version_min}..{seg.policy_version_max}"
        )  # fmt: skip
        experts = "" if seg.routed_experts is None else "x".join(map(str, seg.routed_experts.shape))
        table.add_row(
            str(i), seg.kind, "yes" if seg.rewritten else "", str(len(seg.prompt_ids)),
            str(len(seg.response_ids)), str(model), str(env), versions, experts,
        )  # fmt: skip
    if not trajectory.segments:
        table.add_row("no segments", *[""] * (len(SEGMENT_COLUMNS) - 1))
    return table


def counters_text(trajectory: Trajectory) -> Text:
    c = trajectory.counters
    return Text(
        f"counters: turns {c.turns}  tool calls {c.tool_calls}  parse failures {c.parse_failures}  "
        f"overlong {c.overlong}  aborts resumed {c.aborts_resumed}  "
        f"rewrites: client {c.rewrites_client} template {c.rewrites_template}"
    )


def trajectory_view(trajectory: Trajectory, title: str) -> RenderableType:
    """One attempt's trajectory: title, turns, segments, counters."""
    return Group(Text(title, style="bold"), turn_table(trajectory), segment_table(trajectory),
                 counters_text(trajectory))  # fmt: skip


def attempt_view(loaded: LoadedAttempt) -> RenderableType:
    """One attempt as `trialflow.storage.load_attempt` read it: its trajectory, or why none."""
    n = loaded.record.attempt
    if loaded.trajectory is None:
        why = loaded.error or (
            "a model-free scaffold" if loaded.record.complete else "lost before its first turn"
        )
        return Text(f"attempt {n}: no trajectory ({why})", style="bold")
    source = (
        f"partial: lost attempt, rebuilt from {loaded.checkpoints} checkpoints"
        if loaded.partial
        else "final trajectory"
    )
    return trajectory_view(loaded.trajectory, f"attempt {n} ({source})")


def _attempt_line(record: AttemptRecord) -> str:
    state = "complete" if record.complete else "lost: checkpoints only"
    return f"{record.attempt}: {record.uri or 'no trajectory (model-free)'}  ({state})"


def _step_line(step: StepResult) -> str:
    """One step of a multi-step trial: reward, agent outcome, why the sequence ended there,
    its trajectory."""
    if step.termination_reason is None:
        head = f"{step.name}: set-up failed: {strip_ansi(step.error.message) if step.error else ''}"
    else:
        head = f"{step.name}: {reward_text(step)} ({step.termination_reason}, {step.turns} turns)"
        if not step.reward_valid and step.reward_error:
            head += f" {strip_ansi(step.reward_error)}"
    if step.stopped is not None:
        head += f"; stopped: {step.stopped}"
    uris = [u for u in (step.trajectory_uri, step.logs_uri and f"logs {step.logs_uri}") if u]
    return head + "".join(f"\n  {u}" for u in uris)


def _network_text(result: TrialResult) -> str:
    """Each phase's mode and where it came from ("agent no-network (default), verifier public
    (task)"); a result from before the per-phase fields: its one `network_mode`."""
    if not result.network_modes:
        return result.network_mode
    return ", ".join(
        f"{phase} {mode} ({result.network_origins.get(phase, '?')})"
        for phase, mode in result.network_modes.items()
    )


def result_view(result: TrialResult) -> Table:
    """The trial's outcome as a two-column table."""
    table = Table(title=f"trial {result.trial_id}", title_justify="left", show_header=False)
    table.add_column("field", style="bold")
    table.add_column("value")
    rewards = ", ".join(f"{k}={v:g}" for k, v in sorted(result.rewards.items())) or "none"
    reward = reward_text(result)
    error = "" if result.error is None else (
        f"{result.error.type} in {result.error.phase} (attempt {result.error.attempt}"
        + (", non-retryable" if result.error.non_retryable else "") + f"): {strip_ansi(result.error.message)}"
    )  # fmt: skip
    rows = (
        ("task / scaffold", (f"{result.task_name} / {result.scaffold}  "
                             f"(batch {result.batch_id}, sample {result.sample_index})")),
        ("reward", reward),
        ("rewards", rewards),
        ("reward error", strip_ansi(result.reward_error or "")),
        ("termination", result.termination_reason),
        ("error", error),
        ("attempts", str(result.attempts)),
        ("turns / tool calls", f"{result.turns} / {result.tool_calls}"),
        ("tokens prompt / response", f"{result.prompt_tokens} / {result.response_tokens}"),
        ("timings s", "  ".join(f"{k} {v:.1f}" for k, v in result.timings.items())),
        ("steps", "\n".join(_step_line(s) for s in result.step_results)),
        ("reward strategy", result.multi_step_reward_strategy or ("mean" if result.step_results else "")),
        ("trajectories", "\n".join(_attempt_line(r) for r in result.attempt_records)),
        ("network", _network_text(result)),
        ("logs", "per step (above)" if result.step_results else result.logs_uri or ""),
        ("result", result.result_uri or ""),
    )  # fmt: skip
    for name, value in rows:
        table.add_row(name, value)
    return table


def batch_results(store: ResultStore, batch_id: str) -> list[TrialResult]:
    """Every trial result stored for `batch_id` (`storage.trial_result_key`: one level below
    the batch's ``trials/``; nothing else is named result.json), by trial id. An unknown batch
    gives []."""
    prefix = f"batches/{batch_id}/trials/"
    keys = [
        k for k in store.list_keys(prefix)
        if k.endswith("/result.json") and k[len(prefix):].count("/") == 1
    ]  # fmt: skip
    results = [TrialResult.model_validate_json(store.get_bytes(k)) for k in keys]
    return sorted(results, key=lambda r: r.trial_id)


def record_skipped(store: ResultStore, batch_id: str, skipped: dict[str, list[str]]) -> str:
    """Store what `trialflow run --skip-invalid` left out: task directory -> its problems."""
    body = json.dumps({"batch_id": batch_id, "skipped": skipped}, indent=1).encode()
    return store.put_bytes(batch_skipped_key(batch_id), body, "application/json")


def batch_skipped(store: ResultStore, batch_id: str) -> dict[str, list[str]]:
    """The tasks left out of `batch_id` before submit with their problems ({}: none recorded)."""
    try:
        return dict(json.loads(store.get_bytes(batch_skipped_key(batch_id)))["skipped"])
    except ObjectNotFound:
        return {}


VERIFIER_LOG_CAP = 20_000  # characters shown per file (the tail)


def verifier_logs(store: ResultStore, result: TrialResult) -> dict[str, str]:
    """The last attempt's verifier output as stored by the verify activity: stdout, stderr
    and every file test.sh left under /logs/verifier, by name, ANSI escapes stripped, each
    cut to its last `VERIFIER_LOG_CAP` characters. A multi-step trial's, step by step in the
    order they ran, each name prefixed "step N NAME · ". {} when nothing was stored."""
    if result.attempts < 1:
        return {}
    if not result.step_results:
        return _logs_under(store, TrialKeys(result.batch_id, result.trial_id, result.attempts), "")
    out: dict[str, str] = {}
    for index, step in enumerate(result.step_results, start=1):  # they ran in order, from the first
        keys = TrialKeys(result.batch_id, result.trial_id, result.attempts, step_key(index, step.name))
        out.update(_logs_under(store, keys, f"step {index} {step.name} · "))
    return out


def _logs_under(store: ResultStore, keys: TrialKeys, label: str) -> dict[str, str]:
    prefix = keys.log("verifier") + "/"
    out = {}
    for key in sorted(store.list_keys(prefix)):
        text = strip_ansi(store.get_bytes(key).decode("utf-8", "replace"))
        if len(text) > VERIFIER_LOG_CAP:
            text = f"[... {len(text) - VERIFIER_LOG_CAP} earlier characters cut]\n" + text[-VERIFIER_LOG_CAP:]
        out[label + key[len(prefix) :]] = text
    return out
