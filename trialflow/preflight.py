"""Checks before a batch is submitted: everything a run needs, all problems at once, one
line each, so no trial is wasted on a typo (issue 13, "the first hour").

`check_batch` returns them split into the run's own and each task's (`RunCheck`; `check_run`:
all in one list, empty: go), so `trialflow run --skip-invalid` can run the tasks without
problems and list the others. It checks: at least one attempt; every task
path exists and loads (`trialflow.tasks.load_task`: invalid fields, every one; refused Harbor
features, compose files); its images as set-up would get them (`images`, a
`trialflow.sandbox.image_check.ImageChecker`: Dockerfile lines the engine's builder refuses,
images unavailable offline or refused by their registry); the scaffold resolves with its options; `oracle` has a
`solution/solve.sh` in every task (in a multi-step task: for every step, its own or the
shared one); a task's `skills_dir` has a scaffold that reads skills (oracle and nop ignore
them); a task's `gpus` are there on the in-process worker's host; a scaffold that talks to a model gets one from the in-process worker (its
proxy needs the model's directory and at least one replica; an external worker's own
settings decide, so nothing is checked then); no two tasks would share a trial id; and
the result store answers with its credentials (a probe object is written and read back).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trialflow.batch import TrialIdCollision, task_labels
from trialflow.errors import TaskInvalid, TrialflowError, UnsupportedFeature
from trialflow.sandbox.gpus import gpu_problem
from trialflow.scaffolds import Scaffold, check_scaffold
from trialflow.scaffolds.base import mcp_problem, skills_problem
from trialflow.storage import ResultStore
from trialflow.tasks import Task, gpu_requests, load_task

if TYPE_CHECKING:
    from trialflow.sandbox.image_check import ImageChecker


def _one_line(err: BaseException) -> str:
    if isinstance(err, UnsupportedFeature):
        return f"{err.task_dir}: not supported: " + "; ".join(err.features)
    return " ".join(str(err).split())


def _lines(err: TrialflowError) -> list[str]:
    if isinstance(err, TaskInvalid):
        return [" ".join(line.split()) for line in err.lines()]
    return [_one_line(err)]


@dataclass(frozen=True)
class RunCheck:
    """`general`: problems of the run itself (flags, scaffold, model, store, ids); `tasks`:
    each task directory with problems (as given) -> its problems, in the order given."""

    general: list[str] = field(default_factory=list)
    tasks: dict[Path, list[str]] = field(default_factory=dict)

    @property
    def problems(self) -> list[str]:
        return [*self.general, *(p for lines in self.tasks.values() for p in lines)]


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
    images: ImageChecker | None = None,
) -> list[str]:
    """Problems that would make the batch fail or mislead, one line each (empty: none).
    `host_gpus`: the GPUs of the host whose engine runs the sandboxes (the in-process
    worker's); None: not known here (an external worker refuses such a task itself)."""
    return check_batch(
        task_dirs,
        scaffold,
        samples=samples,
        scaffold_options=scaffold_options,
        store=store,
        model=model,
        host_gpus=host_gpus,
        images=images,
    ).problems


def check_batch(
    task_dirs: Sequence[Path],
    scaffold: str,
    *,
    samples: int,
    scaffold_options: dict[str, Any] | None = None,
    store: Callable[[], ResultStore] | None = None,
    model: InProcessModel | None = None,
    host_gpus: int | None = None,
    images: ImageChecker | None = None,
) -> RunCheck:
    """`check_run`'s problems, the run's apart from each task's."""
    check = RunCheck()
    problems = check.general
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
    if images is not None and images.engine_problem is not None:
        problems.append(
            f"the Docker engine does not answer ({images.engine_problem}); the in-process worker "
            "builds the task images and runs the sandboxes on it"
        )
    existing = []
    for path in task_dirs:
        if not path.is_dir():
            check.tasks.setdefault(path, []).append(f"{path}: no such task directory")
            continue
        existing.append(path)
        mine = _task_problems(path, scaffold, built, host_gpus, images)
        if mine:
            check.tasks.setdefault(path, []).extend(mine)
    try:
        task_labels(existing)
    except TrialIdCollision as err:
        problems.extend(str(err).splitlines())
    if store is not None:
        problems.extend(_check_store(store))
    return check


def _task_problems(
    path: Path, scaffold: str, built: Scaffold | None, host_gpus: int | None, images: ImageChecker | None
) -> list[str]:
    try:
        task = load_task(path)
    except TrialflowError as err:
        return _lines(err)
    out = _missing_solutions(task) if scaffold == "oracle" else []
    out.extend(_host_problems(task, built, host_gpus))
    if images is not None:
        out.extend(f"{task.path}: {line}" for line in images.problems(task))
    return out


def _host_problems(task: Task, scaffold: Scaffold | None, host_gpus: int | None) -> list[str]:
    """What this task needs of the scaffold (skills) and of the sandboxes' host (GPUs)."""
    out = []
    skills = skills_problem(scaffold, task.config.environment.skills_dir) if scaffold is not None else None
    if skills is not None:
        out.append(f"{task.path}: {skills}")
    mcp = mcp_problem(scaffold, task.config.environment.mcp_servers) if scaffold is not None else None
    if mcp is not None:
        out.append(f"{task.path}: {mcp}")
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
