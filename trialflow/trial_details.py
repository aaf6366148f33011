"""What the Temporal UI shows of a trial: its summary and details, in markdown (pure).

The UI is the inspection tool a researcher opens first (docs/ui.md), so a trial's page says
in words what the trial is and how it went, without reading the Result JSON:

- static summary (`summary`, set at start): the list's one line, "claude-code on create-file #0";
- static details (`start_details`, set at start): task, scaffold, sample, batch, model and
  limits, and how to look further (`trialflow inspect`, `trialflow replay --from-record`, the
  trajectory viewer's page);
- current details (`live_details` while it runs, `final_details` at the end; the workflow
  sets them with `workflow.set_current_details`, which is no command: histories replay
  unchanged): phase, attempt, turns and tokens, then reward, termination, turns replayed /
  generated, tokens, where the trajectory is, the error in words, and the same commands;
- `outcome` is the `TrialOutcome` search attribute: "ok", "invalid" (no valid reward, the
  masked kind) or "error" (ended by an error), so `failing_query` lists a batch's trials that
  need a look at a glance (`trialflow run` prints the UI link).
"""

from __future__ import annotations

import re
from urllib.parse import quote, urlencode

from trialflow.viewer import DEFAULT_TEMPORAL_UI_URL, DEFAULT_VIEWER_URL, trial_url
from workflows.shared import (
    SA_BATCH,
    SA_OUTCOME,
    TrialOutcome,
    TrialProgress,
    TrialResult,
    TrialSpec,
)


def viewer_link(trial_id: str, base: str | None = None, batch_id: str | None = None) -> str:
    """The trajectory viewer's page of a trial (`trialflow.viewer.trial_url`; ``base`` None:
    the viewer's default address)."""
    return trial_url(trial_id, base or DEFAULT_VIEWER_URL, batch_id)


def summary(spec: TrialSpec) -> str:
    """The static summary: the one line the UI lists a trial by."""
    rerun = f" (rerun {spec.replay} of {spec.replay_of})" if spec.replay_of else ""
    return f"{spec.scaffold} on {spec.task_name} #{spec.sample_index}{rerun}"


def _commands(trial_id: str, viewer_url: str | None, batch_id: str, recorded: bool = True) -> list[str]:
    """How to look further; ``recorded`` False (no attempt left a trajectory: a model-free
    scaffold) leaves out the re-run from a record."""
    replay = f"`trialflow replay {trial_id} --from-record --model-dir DIR`"
    return [
        f"- inspect: `trialflow inspect {trial_id}`",
        *([f"- re-run its scaffold from the record, no model: {replay}"] if recorded else []),
        f"- trajectory viewer (`trialflow view`): [{trial_id}]({viewer_link(trial_id, viewer_url, batch_id)})",
    ]


def start_details(spec: TrialSpec) -> str:
    """The static details: what the trial is, and how to look further."""
    timeout = f"{spec.agent_timeout_s:g} s" if spec.agent_timeout_s else "the task's"
    lines = [
        f"**task** `{spec.task_name}` · **scaffold** `{spec.scaffold}` · **sample** {spec.sample_index}"
        f" · **batch** `{spec.batch_id}`",
        f"**model** {spec.model or 'the worker’s'} · **attempts** up to {spec.attempt_limit}"
        f" · **agent timeout** {timeout}",
        f"task dir: `{spec.task_path}`",
        "",
        *_commands(spec.trial_id, spec.viewer_url, spec.batch_id),
    ]
    return "\n".join(lines)


_MARKUP = re.compile(r"([\\`*_{}\[\]()#+\-.!|~<>&])")


def plain(text: str) -> str:
    """``text`` as literal markdown: one line, every markup character escaped. For what the
    agent or its task can write (an error's message carries the scaffold's stderr, a reward
    error the verifier's words): the UI renders these details, and an agent must not put a
    link, an image (fetched by the viewer's browser) or HTML there."""
    return _MARKUP.sub(r"\\\1", " ".join(text.split()))


def _tokens(prompt: int, response: int) -> str:
    return f"{prompt:,} prompt / {response:,} generated tokens"


def live_details(progress: TrialProgress, spec: TrialSpec) -> str:
    """The current details while the trial runs: phase, trial attempt, turns, tokens."""
    where = f" on `{progress.host_queue}`" if progress.host_queue else ""
    line = f"**{progress.phase}** · trial attempt {progress.attempt}/{spec.attempt_limit}{where}"
    if progress.phase in ("scaffold", "verify", "teardown") and progress.turns:
        line += f" · turn {progress.turns} · {_tokens(progress.prompt_tokens, progress.response_tokens)}"
    return line


def outcome(result: TrialResult) -> TrialOutcome:
    """The `TrialOutcome` search attribute (module docstring)."""
    if result.failed:
        return "error"
    return "ok" if result.reward_valid else "invalid"


def final_details(result: TrialResult, spec: TrialSpec) -> str:
    """The current details once the trial is done: how it went, where its records are."""
    valid = "valid" if result.reward_valid else f"**invalid**: {plain(result.reward_error or 'no reward')}"
    attempts = f"{result.attempts} attempt{'s' if result.attempts != 1 else ''}"
    lines = [
        f"### reward {result.reward:.3f} ({valid}) · {result.termination_reason}",
        f"turns {result.turns} ({result.replayed_turns} replayed, {result.generated_turns} generated)"
        f" · {_tokens(result.prompt_tokens, result.response_tokens)} · {attempts}",
    ]
    if result.error is not None:
        e = result.error
        lines.append(f"**error** {plain(e.type)} in {e.phase} (attempt {e.attempt}): {plain(e.message)}")
    for record in result.attempt_records:
        if record.trajectory_uri:
            lines.append(f"attempt {record.attempt} trajectory: `{record.trajectory_uri}`")
        elif not record.complete:
            lines.append(
                f"attempt {record.attempt} trajectory: `{record.checkpoints_uri}` (checkpoints only: lost)"
            )
    if result.result_uri:
        lines.append(f"result: `{result.result_uri}`")
    recorded = bool(result.trajectory_uris)
    lines += ["", *_commands(result.trial_id, spec.viewer_url, result.batch_id, recorded)]
    return "\n".join(lines)


def failing_query(batch_id: str) -> str:
    """The visibility query of a batch's trials that ended invalid or by an error."""
    return f'{SA_BATCH} = "{batch_id}" AND {SA_OUTCOME} != "ok"'


def workflows_ui_url(query: str, ui_url: str | None = None, namespace: str = "default") -> str:
    """The Temporal UI's workflow list filtered by ``query`` (a saved view the user can keep)."""
    base = (ui_url or DEFAULT_TEMPORAL_UI_URL).rstrip("/")
    return f"{base}/namespaces/{quote(namespace, safe='')}/workflows?{urlencode({'query': query})}"
