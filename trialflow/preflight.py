"""Checks before a batch is submitted: everything a run needs, all problems at once, one
line each, so no trial is wasted on a typo (issue 13, "the first hour").

`check_run` returns the problems (empty: go). It checks: at least one attempt; every task
path exists and loads (`trialflow.tasks.load_task`: invalid fields, refused Harbor
features, compose files); the scaffold resolves with its options; `oracle` has a
`solution/solve.sh` in every task (in a multi-step task: for every step, its own or the
shared one); a task's `skills_dir` has a scaffold that reads skills (oracle and nop ignore
them); a task's `gpus` are there on the in-process worker's host; a scaffold that talks to a model gets one from the in-process worker (its
proxy needs the model's directory and at least one replica; an external worker's own
settings decide, so nothing is checked then); no two tasks would share a trial id; and
the result store answers with its credentials (a probe object is written and read back).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trialflow.batch import TrialIdCollision, task_labels
from trialflow.errors import TrialflowError, UnsupportedFeature
from trialflow.sandbox.gpus import gpu_problem
from trialflow.scaffolds import Scaffold, check_scaffold
from trialflow.scaffolds.base import skills_problem
from trialflow.storage import ResultStore
from trialflow.tasks import Task, gpu_requests, load_task


def _one_line(err: BaseException) -> str:
    if isinstance(err, UnsupportedFeature):
        return f"{err.task_dir}: not supported: " + "; ".join(err.features)
    return " ".join(str(err).split())


@dataclass(frozen=True)
class InProcessModel:
    """What the in-process worker's proxy will serve a model-driven scaffold with."""

    model_dir: Path | None
    replicas: Sequence[str]


def check_run(
    task_dirs: Sequence[Path],
    scaffold: str,
    *,
    samples: int,
    scaffold_options: dict[str, Any] | None = None,
    store: Callable[[], ResultStore] | None = None,
    model: InProcessModel | None = None,
    host_gpus: int | None = None,
) -> list[str]:
    """Problems that would make the batch fail or mislead, one line each (empty: none).
    `host_gpus`: the GPUs of the host whose engine runs the sandboxes (the in-process
    worker's); None: not known here (an external worker refuses such a task itself)."""
    problems: list[str] = []
    if samples < 1:
        problems.append(f"--samples must be at least 1 (got {samples})")
    if not task_dirs:
        problems.append("no task directories given")
    built: Scaffold | None = None
    try:
        built = check_scaffold(scaffold, scaffold_options)
    except TrialflowError as err:
        problems.append(f"--scaffold: {_one_line(err)}")
    else:
        if built.needs_model and model is not None:
            problems.extend(_missing_model(scaffold, model))
    existing = []
    for path in task_dirs:
        if not path.is_dir():
            problems.append(f"{path}: no such task directory")
            continue
        existing.append(path)
        try:
            task = load_task(path)
        except TrialflowError as err:
            problems.append(_one_line(err))
            continue
        if scaffold == "oracle":
            problems.extend(_missing_solutions(task))
        problems.extend(_host_problems(task, built, host_gpus))
    try:
        task_labels(existing)
    except TrialIdCollision as err:
        problems.extend(str(err).splitlines())
    if store is not None:
        problems.extend(_check_store(store))
    return problems


def _host_problems(task: Task, scaffold: Scaffold | None, host_gpus: int | None) -> list[str]:
    """What this task needs of the scaffold (skills) and of the sandboxes' host (GPUs)."""
    out = []
    skills = skills_problem(scaffold, task.config.environment.skills_dir) if scaffold is not None else None
    if skills is not None:
        out.append(f"{task.path}: {skills}")
    if host_gpus is None:
        return out
    for where, count in gpu_requests(task.config):
        problem = gpu_problem(where, count, host_gpus)
        if problem is not None:
            out.append(f"{task.path}: {problem}")
    return out


def _missing_model(scaffold: str, model: InProcessModel) -> list[str]:
    out = []
    if model.model_dir is None:
        out.append(
            f"--scaffold {scaffold} talks to a model: give --model-dir DIR (the model's tokenizer and "
            "chat template, which the proxy renders with; TRIALFLOW_MODEL_DIR), e.g. the one `trialflow up` prints"
        )
    elif not (model.model_dir / "tokenizer_config.json").is_file():
        out.append(f"--model-dir {model.model_dir}: no tokenizer_config.json there (not a model directory)")
    if not model.replicas:
        out.append(
            f"--scaffold {scaffold} talks to a model: give --replica URL (a vLLM server; TRIALFLOW_REPLICA_URLS)"
        )
    return out


def _missing_solutions(task: Task) -> list[str]:
    """The oracle runs solution/solve.sh, or per step steps/<name>/solution/solve.sh (the
    shared one where a step has no solution/ of its own)."""
    if not task.steps:
        if task.solution_dir is None:
            return [f"{task.path}: solution/solve.sh is missing (the oracle scaffold runs it)"]
        return []
    out = []
    for s in task.steps:
        if s.solution_dir is not None and not (s.solution_dir / "solve.sh").is_file():
            out.append(
                f"{task.path}: steps/{s.name}/solution/solve.sh is missing (the oracle scaffold runs it)"
            )
        elif s.solution_dir is None and task.solution_dir is None:
            out.append(
                f"{task.path}: step {s.name!r}: neither steps/{s.name}/solution/solve.sh nor solution/solve.sh "
                "exists (the oracle scaffold runs it)"
            )
    return out


def _check_store(make: Callable[[], ResultStore]) -> list[str]:
    key = "preflight/probe"
    try:
        st = make()
        st.put_bytes(key, b"ok")
        if st.get_bytes(key) != b"ok":
            return ["result store: a probe object read back different bytes"]
    except Exception as err:  # any client error: credentials, endpoint, permissions
        return [f"result store does not answer: {type(err).__name__}: {' '.join(str(err).split())[:300]}"]
    return []
