"""Harbor task loader: a task directory -> `Task`.

Layout (Harbor format)::

    task-name/
      task.toml              config: `trialflow.task_config.TaskConfig` (Harbor 0.25's schema)
      instruction.md         the prompt given to the agent (required, non-empty; leading
                             canary lines are stripped, as Harbor does)
      environment/Dockerfile image to build (required unless [environment].docker_image)
      tests/test.sh          verifier entry point (required); writes /logs/verifier/reward.{json,txt}
      tests/Dockerfile       a separate verifier environment's own image (optional; Harbor's precedence:
                             `Task.separate_verifier`)
      solution/solve.sh      reference solution (optional; the `oracle` scaffold needs it)
      steps/<name>/          multi-step tasks (`[[steps]]`, Harbor's layout): per step
        instruction.md       that step's prompt (required; no top-level instruction.md needed)
        tests/test.sh        overlays the shared tests/ (one of the two test.sh must exist)
        solution/solve.sh    the oracle's script for the step (else the shared solution/)
        workdir/             copied into the sandbox's working directory before the step;
                             its setup.sh then runs there (a failure stops the sequence)

Order of checks (so the first error is the one that matters): the directory exists; no
`environment/docker-compose.yml` (Harbor reads only `.yaml`: `UnsupportedEnvironment`);
task.toml parses and validates as Harbor's schema (`TaskInvalid` naming the field);
`environment/docker-compose.yaml`, when present, is valid Compose (`TaskInvalid` naming the
file and field); no feature trialflow refuses, in task.toml or the compose file
(`UnsupportedFeature`, every one listed: `unsupported_features`, `trialflow.compose.load`);
then the files.

Edge cases:
- Unknown keys anywhere are kept (pydantic `extra="allow"`), listed in `Task.unknown_keys`
  as dotted paths and logged once at load; they never fail a load (Harbor drops them).
- `Task.env_hash` hashes only environment/ (the image cache key: editing tests does not
  rebuild); `Task.content_hash` hashes the whole task. Both are stable across machines:
  sorted relative paths, file bytes and the executable bit; mtimes and owners are ignored;
  `__pycache__` dirs and `*.pyc` files are skipped.
- A multi-step task's `Task.instruction` is "" (as Harbor's); `Task.step_view(name)` is the
  task as one step sees it (instruction, tests, solution, agent/verifier settings, artifacts),
  which the scaffold and verifier activities run exactly like a single-step task.
- docs/harbor.md lists every task.toml field: as in Harbor, or refused with its message.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import re
import tomllib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from trialflow.compose import COMPOSE_FILE, ComposeInvalid, ComposeProject, ComposeRefused, ComposeService
from trialflow.compose import interpolation_env as compose_interpolation_env
from trialflow.compose import load_compose as parse_compose
from trialflow.errors import TaskEnvMissing, TaskInvalid, UnsupportedEnvironment, UnsupportedFeature
from trialflow.task_config import (
    MAIN_SERVICE,
    EnvironmentConfig,
    StepConfig,
    TaskConfig,
    TaskOS,
    VerifierEnvironmentMode,
    parse_size_mb,
)

__all__ = [
    "Task",
    "TaskStep",
    "TaskConfig",
    "SeparateVerifier",
    "TaskImage",
    "hash_tree",
    "load_task",
    "parse_size_mb",
    "load_task_compose",
    "resolve_env",
    "service_image",
    "strip_canary",
    "unsupported_features",
]

log = logging.getLogger(__name__)

TASK_TOML = "task.toml"
INSTRUCTION = "instruction.md"
DOCKERFILE = "environment/Dockerfile"
TEST_SCRIPT = "tests/test.sh"
VERIFIER_DOCKERFILE = "tests/Dockerfile"  # the separate verifier environment's (Harbor)
SOLVE_SCRIPT = "solution/solve.sh"
STEPS_DIR = "steps"
COMPOSE = f"environment/{COMPOSE_FILE}"  # the one name Harbor's docker environment reads
# Harbor's template: the WHOLE value is `${VAR}` or `${VAR:-default}`; anything else is literal.
_ENV_TEMPLATE = re.compile(r"\$\{([^}:]+)(?::-(.*))?\}")


def resolve_env(env: dict[str, str], host_env: Any = None) -> dict[str, str]:
    """Harbor's `resolve_env_vars`: a value that is exactly `${VAR}` / `${VAR:-default}` takes
    the host's VAR when it is set (even to ""), else the default; a `${VAR}` with neither
    raises `TaskEnvMissing`. Text around a template (`x-${VAR}`) makes the value literal."""
    host = os.environ if host_env is None else host_env
    out = {}
    for key, value in env.items():
        m = _ENV_TEMPLATE.fullmatch(value)
        if m is None:
            out[key] = value
        elif m.group(1) in host:
            out[key] = host[m.group(1)]
        elif m.group(2) is not None:
            out[key] = m.group(2)
        else:
            raise TaskEnvMissing(f"Environment variable '{m.group(1)}' not found in host environment")
    return out


def unknown_keys(model: BaseModel, prefix: str = "") -> list[str]:
    """Dotted paths of every key kept as an extra on `model` and its nested sections."""
    out = [f"{prefix}{k}" for k in (model.model_extra or {})]
    for name in type(model).model_fields:
        value = getattr(model, name)
        if isinstance(value, BaseModel):
            out.extend(unknown_keys(value, f"{prefix}{name}."))
        elif isinstance(value, list):
            for i, item in enumerate(value):
                if isinstance(item, BaseModel):
                    out.extend(unknown_keys(item, f"{prefix}{name}[{i}]."))
    return out


def _environment_refusals(env: EnvironmentConfig, where: str) -> list[str]:
    """What an environment section (`[environment]`, or the separate verifier's
    `[verifier.environment]`) asks for that no sandbox here gives."""
    out = []
    if env.os != TaskOS.LINUX:
        out.append(f"{where}.os = {env.os.value!r}: only Linux containers run here")
    if env.tpu is not None:
        out.append(f"{where}.tpu: sandboxes get no TPUs")
    with_headers = [s.name for s in env.mcp_servers if s.headers]
    if with_headers:  # Harbor's header rules (credentials as ${VAR} references) are not repeated here
        out.append(
            f"[[{where.strip('[]')}.mcp_servers]] ({', '.join(with_headers)}): MCP headers are not passed to scaffolds"
        )
    for key, value in (
        ("build_timeout_sec", env.build_timeout_sec),
        ("cpus", env.cpus),
        ("memory_mb", env.memory_mb),
    ):
        if value is not None and not (math.isfinite(value) and value > 0):
            out.append(f"{where}.{key} = {value}: must be a positive number")
    if env.workdir is not None and not env.workdir.startswith("/"):
        out.append(f"{where}.workdir = {env.workdir!r}: must be an absolute path")
    if env.healthcheck is not None and env.healthcheck.timeout_sec <= 0:
        out.append(f"[{where.strip('[]')}.healthcheck].timeout_sec: must be a positive number")
    return out


def unsupported_features(config: TaskConfig) -> list[str]:
    """What this task asks for that trialflow does not do, one sentence each (empty: none).
    Also values Harbor accepts but that cannot mean anything (a timeout of 0)."""
    out = _environment_refusals(config.environment, "[environment]")
    if config.verifier.environment is not None:
        out += _environment_refusals(config.verifier.environment, "[verifier.environment]")
    for step in config.steps or []:
        out.extend(_step_refusals(config, step))
    if config.verifier.collect:
        out.append("[[verifier.collect]]: collect hooks are not run")
    for a in config.artifact_entries():
        if a.service not in (None, MAIN_SERVICE):
            out.append(
                f"artifacts: source {a.source!r} from service {a.service!r}: artifacts are collected from "
                "the main service only"
            )
    for where, value in (
        ("[agent].timeout_sec", config.agent.timeout_sec),
        ("[verifier].timeout_sec", config.verifier.timeout_sec),
    ):
        if value is not None and not (math.isfinite(value) and value > 0):
            out.append(f"{where} = {value}: must be a positive number")
    return out


def gpu_requests(config: TaskConfig) -> list[tuple[str, int]]:
    """Every environment of the task that asks for GPUs, as (section, count): the agent's,
    the separate verifier's, each step's separate verifier's (`trialflow.sandbox.gpus`)."""
    envs = [("[environment]", config.environment), ("[verifier.environment]", config.verifier.environment)]
    for step in config.steps or []:
        envs.append((f"[[steps]] {step.name!r}: [steps.verifier.environment]", step.verifier.environment))
    return [(where, env.gpus) for where, env in envs if env is not None and env.gpus]


def step_verifier_mode(config: TaskConfig, step: StepConfig) -> VerifierEnvironmentMode:
    """Harbor's precedence: the step's explicit mode, else its [steps.verifier.environment]
    (implies separate), else the task's resolved mode."""
    return config.step_verifier_mode(step)


def _step_refusals(config: TaskConfig, step: StepConfig) -> list[str]:
    where, out = f"[[steps]] {step.name!r}", []
    if step.verifier.environment is not None:
        refused = _environment_refusals(step.verifier.environment, "[steps.verifier.environment]")
        out += [f"{where}: {r}" for r in refused]
    if step.verifier.collect:
        out.append(f"{where}: [[steps.verifier.collect]]: collect hooks are not run")
    for a in step.artifacts:
        service = None if isinstance(a, str) else a.service
        if service not in (None, MAIN_SERVICE):
            out.append(
                f"{where}: artifacts from service {service!r}: artifacts are collected from the main service only"
            )
    for name, value in (
        ("agent.timeout_sec", step.agent.timeout_sec),
        ("verifier.timeout_sec", step.verifier.timeout_sec),
    ):
        if value is not None and not (math.isfinite(value) and value > 0):
            out.append(f"{where} {name} = {value}: must be a positive number")
    if step.healthcheck is not None and step.healthcheck.timeout_sec <= 0:
        out.append(f"{where} healthcheck.timeout_sec: must be a positive number")
    return out


_CANARY = re.compile(r"^(<!--.*canary.*-->|#.*canary.*)$", re.IGNORECASE)


def strip_canary(text: str) -> str:
    """Leading canary lines (data-provenance markers) and the blank lines after them are
    removed from the instruction, as Harbor does: the agent never sees them."""
    lines = text.split("\n")
    i = 0
    while i < len(lines) and _CANARY.match(lines[i].strip()):
        i += 1
    while i < len(lines) and not lines[i].strip():
        i += 1
    return "\n".join(lines[i:])


class TaskImage(BaseModel):
    """One image a task needs: built from `context_dir` (its Dockerfile) once per content
    hash, or the prebuilt local `docker_image` (which wins when set, as in Harbor)."""

    model_config = ConfigDict(frozen=True)

    label: str  # names it in messages: "task NAME" / "task NAME (verifier)"
    context_dir: Path
    dockerfile: Path | None  # None only with docker_image
    docker_image: str | None
    build_timeout_sec: float
    content_hash: str  # sha256 hex of context_dir: the cache key
    prefix: str = "trialflow-task"

    # a compose service's build (`trialflow.compose.ServiceBuild`): its args and target
    build_args: dict[str, str] = {}
    target: str | None = None

    @property
    def tag(self) -> str:
        return self.docker_image or f"{self.prefix}:{self.content_hash[:32]}"


def service_image(task_label: str, service: ComposeService, build_timeout_sec: float) -> TaskImage:
    """The image of a compose service: the one its `build` makes, tagged
    `trialflow-service:<hash>` of its context, Dockerfile, args and target (never the
    service's own `image:` name, so no public tag is overwritten); without a build, its
    `image`, got as a `docker_image` is (present, pulled, or offline a stand-in)."""
    label = f"{task_label} (service {service.name})"
    build = service.build
    if build is None:
        assert service.image is not None  # compose.load: image or build
        return TaskImage(
            label=label,
            context_dir=Path("."),
            dockerfile=None,
            docker_image=service.image,
            build_timeout_sec=build_timeout_sec,
            content_hash=hashlib.sha256(service.image.encode()).hexdigest(),
        )
    h = hashlib.sha256(hash_tree(build.context).encode())
    h.update(os.path.relpath(build.dockerfile, build.context).encode() + b"\0")
    h.update(build.dockerfile.read_bytes())
    h.update(repr((sorted(build.args.items()), build.target)).encode())
    return TaskImage(
        label=label,
        context_dir=build.context,
        dockerfile=build.dockerfile,
        docker_image=None,
        build_timeout_sec=build_timeout_sec,
        content_hash=h.hexdigest(),
        prefix="trialflow-service",
        build_args=build.args,
        target=build.target,
    )


class SeparateVerifier(BaseModel):
    """Where a separate verifier runs (`[verifier] environment_mode = "separate"` or
    `[verifier.environment]`): a fresh sandbox of `image` with `config`'s resources, env,
    workdir and network. `bundled_tests`: the image brings its own /tests (Harbor does not
    upload tests/ then)."""

    model_config = ConfigDict(frozen=True)

    config: EnvironmentConfig
    image: TaskImage
    bundled_tests: bool


class TaskStep(BaseModel):
    """One `[[steps]]` entry's files, as loaded (paths absolute; absent ones None)."""

    model_config = ConfigDict(frozen=True)

    name: str
    index: int  # 1-based position in the sequence
    instruction: str  # steps/<name>/instruction.md, canary lines stripped
    tests_dir: Path | None  # steps/<name>/tests
    solution_dir: Path | None  # steps/<name>/solution (when it exists, the oracle uses only it)
    workdir: Path | None  # steps/<name>/workdir
    # Where this step's verifier runs (Harbor's per-step resolution); None: the agent's sandbox.
    separate_verifier: SeparateVerifier | None = None

    @property
    def key(self) -> str:
        """The step's folder in the store and in ids: index + a safe form of the name
        (two names that differ only in unsafe characters stay apart)."""
        return step_key(self.index, self.name)


def step_key(index: int, name: str) -> str:
    """`TaskStep.key` of the `index`-th (1-based) step named `name`."""
    return f"{index}-{_safe(name)}"


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_") or "_"


class Task(BaseModel):
    """A loaded, validated task. Paths are absolute. Immutable."""

    model_config = ConfigDict(frozen=True)

    name: str  # directory name (what workflow ids use)
    path: Path
    config: TaskConfig
    instruction: str
    environment_dir: Path
    dockerfile: Path | None  # None only when [environment].docker_image is used
    tests_dir: Path
    solution_dir: Path | None  # None when the task ships no solution/solve.sh
    env_hash: str  # sha256 hex of environment/
    content_hash: str  # sha256 hex of the whole task dir
    image: TaskImage  # the agent's: environment/, or the prebuilt docker_image
    # environment/docker-compose.yaml as loaded (variables from the loading process; set-up
    # loads it again with the worker's: `load_task_compose`); None: no compose file
    compose: ComposeProject | None = None
    unknown_keys: tuple[str, ...] = ()
    # None: the verifier shares the agent's sandbox. Always None on a multi-step task itself:
    # each step resolves its own (`TaskStep.separate_verifier`, set on its `step_view`).
    separate_verifier: SeparateVerifier | None = None
    steps: tuple[TaskStep, ...] = ()  # empty: a single-step task
    # Set on a step's view (`step_view`): that step's name, and the step's tests/ laid over
    # `tests_dir` (the shared tests/) when both exist, as Harbor uploads them.
    step_name: str | None = None
    tests_overlay: Path | None = None

    def step(self, name: str) -> TaskStep:
        for step in self.steps:
            if step.name == name:
                return step
        raise KeyError(f"task {self.name} has no step {name!r}")

    def step_view(self, name: str) -> Task:
        """The task as step `name` runs it (Harbor 0.25's MultiStepTrial):
        - the step's instruction; its solution/ for the oracle when it exists, else the
          task's solution/;
        - tests: the shared tests/ with the step's tests/ uploaded over it (so the step's
          test.sh wins when it has one);
        - `[agent]`: the step's timeout_sec / user / network policy where set, else the task's;
        - `[verifier]`: env merged (the step's keys win), user and network policy the step's
          where set, else the task's; timeout_sec is the STEP's own value, whose default is
          600 (Harbor's step VerifierConfig always has one, so the task's never applies);
        - artifacts: the task's, then the step's;
        - where the verifier runs: the step's own resolution (`TaskStep.separate_verifier`)."""
        step, cfg = self.step(name), self.config
        scfg = next(s for s in cfg.steps or [] if s.name == name)
        shared_tests = self.tests_dir if self.tests_dir.is_dir() else None
        tests_dir = shared_tests or step.tests_dir
        assert tests_dir is not None  # load_task checked that one of them holds test.sh
        agent = cfg.agent.model_copy(
            update={
                "timeout_sec": _first(scfg.agent.timeout_sec, cfg.agent.timeout_sec),
                "user": _first(scfg.agent.user, cfg.agent.user),
                **_phase_network(scfg.agent, cfg.agent),
            }
        )
        verifier = cfg.verifier.model_copy(
            update={
                "timeout_sec": scfg.verifier.timeout_sec,
                "env": {**cfg.verifier.env, **scfg.verifier.env},
                "user": _first(scfg.verifier.user, cfg.verifier.user),
                **_phase_network(scfg.verifier, cfg.verifier),
            }
        )
        config = cfg.model_copy(
            update={"agent": agent, "verifier": verifier, "artifacts": [*cfg.artifacts, *scfg.artifacts]}
        )
        return self.model_copy(
            update={
                "config": config,
                "instruction": step.instruction,
                "tests_dir": tests_dir,
                "tests_overlay": step.tests_dir if shared_tests is not None else None,
                "solution_dir": step.solution_dir or self.solution_dir,
                "step_name": name,
                "separate_verifier": step.separate_verifier,
            }
        )

    @property
    def verifier_images(self) -> tuple[TaskImage, ...]:
        """Every separate verifier environment's image this task can use (its own, or one
        per step), each once: set-up builds them all before the agent runs."""
        found = [self.separate_verifier, *(s.separate_verifier for s in self.steps)]
        images = {v.image.tag: v.image for v in found if v is not None}
        return tuple(images.values())

    @property
    def service_images(self) -> tuple[TaskImage, ...]:
        """The images of the compose services as loaded (`Task.compose`), for checks before
        submitting; set-up gets them from the compose file loaded again with its worker's
        variables. A service running main's own image (`${MAIN_IMAGE_NAME}`) is left out:
        that is built with the task."""
        if self.compose is None:
            return ()
        build_timeout = self.config.environment.build_timeout_sec
        images = (service_image(self.image.label, s, build_timeout) for s in self.compose.services)
        return tuple(i for i in images if i.tag != self.image.tag)

    @property
    def image_tag(self) -> str:
        """Local tag of the built task image; prebuilt `docker_image` wins when set."""
        return self.image.tag


def _first(*values: Any) -> Any:
    return next((v for v in values if v is not None), None)


def _phase_network(step: Any, task: Any) -> dict[str, Any]:
    """Harbor's `explicit_phase_policy`: the step's network_mode (with its hosts) when set,
    else the task's phase override."""
    src = step if step.network_mode is not None else task
    return {"network_mode": src.network_mode, "allowed_hosts": src.allowed_hosts}


def _iter_files(root: Path) -> list[Path]:
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for f in sorted(filenames):
            if not f.endswith(".pyc"):
                out.append(Path(dirpath) / f)
    return sorted(out, key=lambda p: p.relative_to(root).as_posix())


def hash_tree(root: Path, only: list[str] | None = None) -> str:
    """sha256 over (relative path, exec bit, bytes or link target) of every file under
    `root` (restricted to top-level entries in `only` if given). Missing entries are skipped."""
    h = hashlib.sha256()
    entries = [root / o for o in only] if only is not None else [root]
    for entry in entries:
        files = (
            [entry] if entry.is_file() or entry.is_symlink() else _iter_files(entry) if entry.is_dir() else []
        )
        for f in files:
            rel = f.relative_to(root).as_posix()
            h.update(rel.encode() + b"\0")
            if f.is_symlink():
                h.update(b"L" + os.readlink(f).encode() + b"\0")
                continue
            h.update(b"X" if os.access(f, os.X_OK) else b"F")
            data = f.read_bytes()
            h.update(len(data).to_bytes(8, "big") + data)
    return h.hexdigest()


def _field_path(loc: tuple[Any, ...]) -> str:
    return ".".join(str(p) for p in loc) or "(root)"


def load_task(path: str | os.PathLike[str]) -> Task:
    """Load and validate the task at `path`. Raises TaskInvalid / UnsupportedEnvironment."""
    root = Path(path).resolve()
    tdir = str(root)
    if not root.is_dir():
        raise TaskInvalid(tdir, ".", None, "task directory does not exist")
    if (root / "environment/docker-compose.yml").exists() and not (root / COMPOSE).exists():
        raise UnsupportedEnvironment(
            f"{tdir}: environment/docker-compose.yml: rename it to {COMPOSE_FILE} (Harbor's docker "
            "environment reads only that name and would run the task without its services)"
        )

    toml_path = root / TASK_TOML
    if not toml_path.is_file():
        raise TaskInvalid(tdir, TASK_TOML, None, "file is missing")
    try:
        raw = tomllib.loads(toml_path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise TaskInvalid(tdir, TASK_TOML, None, f"not UTF-8: {e}") from None
    except tomllib.TOMLDecodeError as e:
        raise TaskInvalid(tdir, TASK_TOML, None, f"TOML syntax error: {e}") from None
    try:
        config = TaskConfig.model_validate(raw)
    except ValidationError as e:
        found = [(_field_path(err["loc"]), err["msg"]) for err in e.errors()]
        (field, message), more = found[0], tuple(found[1:])
        raise TaskInvalid(tdir, TASK_TOML, field, message, more) from None
    refused = unsupported_features(config)
    env_hash = hash_tree(root, ["environment"])
    dockerfile = root / DOCKERFILE if (root / DOCKERFILE).is_file() else None
    agent_image = TaskImage(
        label=f"task {root.name}",
        context_dir=root / "environment",
        dockerfile=dockerfile,
        docker_image=config.environment.docker_image,
        build_timeout_sec=config.environment.build_timeout_sec,
        content_hash=env_hash,
    )
    compose = None
    if (root / COMPOSE).is_file():
        try:
            compose = load_task_compose(root, config, agent_image, os.environ, strict=False)
        except ComposeRefused as e:
            refused += [f"{COMPOSE}: {r}" for r in e.reasons]
    if refused:
        raise UnsupportedFeature(tdir, refused)
    if dockerfile is None and config.environment.docker_image is None:
        raise TaskInvalid(tdir, DOCKERFILE, None, "file is missing and [environment].docker_image is not set")
    steps = tuple(
        _load_step(root, s.name, i, _separate_verifier(root, config, agent_image, s))
        for i, s in enumerate(config.steps or [], start=1)
    )
    # Harbor: a multi-step task's instruction lives in each step; the top-level one is unused.
    instruction = "" if steps else _read_instruction(root, INSTRUCTION)

    for step in steps:
        own = step.tests_dir is not None and (step.tests_dir / "test.sh").is_file()
        if not own and not (root / TEST_SCRIPT).is_file():
            raise TaskInvalid(
                tdir,
                f"{STEPS_DIR}/{step.name}/{TEST_SCRIPT}",
                None,
                f"file is missing (and so is {TEST_SCRIPT})",
            )
    if not steps and not (root / TEST_SCRIPT).is_file():
        raise TaskInvalid(tdir, TEST_SCRIPT, None, "file is missing")
    solution_dir = root / "solution" if (root / SOLVE_SCRIPT).is_file() else None

    extras = tuple(unknown_keys(config))
    if extras:
        log.info("task %s: ignoring unknown task.toml keys: %s", root.name, ", ".join(extras))
    return Task(
        name=root.name,
        path=root,
        config=config,
        instruction=instruction,
        environment_dir=root / "environment",
        dockerfile=dockerfile,
        tests_dir=root / "tests",
        solution_dir=solution_dir,
        env_hash=env_hash,
        content_hash=hash_tree(root, [TASK_TOML, INSTRUCTION, "environment", "tests", "solution", STEPS_DIR]),
        unknown_keys=extras,
        image=agent_image,
        compose=compose,
        separate_verifier=None if steps else _separate_verifier(root, config, agent_image),
        steps=steps,
    )


def load_task_compose(
    root: Path, config: TaskConfig, agent_image: TaskImage, host_env: Any, *, strict: bool = True
) -> ComposeProject:
    """environment/docker-compose.yaml with Compose's variables as Harbor sets them
    (`trialflow.compose.interpolation_env`: `host_env`, the task's [environment].env,
    Harbor's MAIN_IMAGE_NAME etc.). Not strict (at load, maybe not where it will run): a
    task env template whose variable is unset, and `${VAR?}` in the file, give "".
    Raises TaskInvalid (what Compose rejects), ComposeRefused, TaskEnvMissing (strict)."""
    envcfg = config.environment
    if strict:
        task_env = resolve_env(envcfg.env, host_env)
    else:
        task_env = {}
        for key, value in envcfg.env.items():
            try:
                task_env.update(resolve_env({key: value}, host_env))
            except TaskEnvMissing:
                task_env[key] = ""
    env = compose_interpolation_env(
        host_env,
        task_env,
        main_image=agent_image.tag,
        context_dir=agent_image.context_dir,
        prebuilt_image=envcfg.docker_image,
        cpus=envcfg.cpus,
        memory_mb=envcfg.memory_mb,
    )
    try:
        return parse_compose(root / COMPOSE, env, strict=strict)
    except ComposeInvalid as e:
        raise TaskInvalid(str(root), COMPOSE, e.field or None, e.message) from None


def _read_instruction(root: Path, rel: str) -> str:
    path = root / rel
    if not path.is_file():
        raise TaskInvalid(str(root), rel, None, "file is missing")
    try:
        text = strip_canary(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise TaskInvalid(str(root), rel, None, f"not UTF-8: {e}") from None
    if not text.strip():
        raise TaskInvalid(str(root), rel, None, "file is empty")
    return text


def _load_step(root: Path, name: str, index: int, separate: SeparateVerifier | None) -> TaskStep:
    """steps/<name>/: its instruction (required), tests, solution and workdir. A solution/
    without solve.sh loads, as in Harbor (only the oracle needs it: preflight and the oracle
    say so)."""
    base = root / STEPS_DIR / name
    rel = f"{STEPS_DIR}/{name}"
    if not base.is_dir():
        raise TaskInvalid(str(root), rel, None, "step directory is missing")
    instruction = _read_instruction(root, f"{rel}/{INSTRUCTION}")
    tests = base / "tests"
    solution = base / "solution"
    return TaskStep(
        name=name,
        index=index,
        instruction=instruction,
        tests_dir=tests if tests.is_dir() else None,
        solution_dir=solution if solution.is_dir() else None,
        workdir=base / "workdir" if (base / "workdir").is_dir() else None,
        separate_verifier=separate,
    )


def _separate_verifier(
    root: Path, config: TaskConfig, agent_image: TaskImage, step: StepConfig | None = None
) -> SeparateVerifier | None:
    """Harbor 0.25's `resolve_verifier_environment_definition`, for the task or one of its
    steps. The environment: `TaskConfig.verifier_environment`. The image, first match: for a
    step, its [steps.verifier.environment].docker_image, else one built from
    steps/<name>/tests/ when it holds a Dockerfile; then `[verifier.environment].docker_image`,
    else one built from tests/ when it holds a Dockerfile (all of these bring their own
    /tests); else the agent's image (tests uploaded)."""
    env = config.verifier_environment(step)
    if env is None:
        return None
    candidates = [(config.verifier.environment, "tests")]
    if step is not None:
        candidates.insert(0, (step.verifier.environment, f"{STEPS_DIR}/{step.name}/tests"))
    label = f"task {root.name} (verifier{f' of step {step.name}' if step else ''})"
    for own, rel in candidates:
        tests = root / rel
        if (tests / "docker-compose.yaml").is_file():
            raise UnsupportedEnvironment(
                f"{root}: {rel}/docker-compose.yaml: docker-compose verifier environments are refused: "
                "a separate verifier runs in one fresh container, without services"
            )
        if own is not None and own.docker_image:
            image = TaskImage(
                label=label,
                context_dir=tests,
                dockerfile=None,
                docker_image=own.docker_image,
                build_timeout_sec=config.environment.build_timeout_sec,  # Harbor: the trial's build bound
                content_hash=hash_tree(root, [rel]),
            )
            config_ = env.model_copy(update={"docker_image": own.docker_image})
            return SeparateVerifier(config=config_, image=image, bundled_tests=True)
        if (tests / "Dockerfile").is_file():
            image = TaskImage(
                label=label,
                context_dir=tests,
                dockerfile=tests / "Dockerfile",
                docker_image=None,
                build_timeout_sec=config.environment.build_timeout_sec,  # Harbor: the trial's build bound
                content_hash=hash_tree(root, [rel]),
                prefix="trialflow-verifier",
            )
            config_ = env.model_copy(update={"docker_image": None})
            return SeparateVerifier(config=config_, image=image, bundled_tests=True)
    update: dict[str, Any] = {"docker_image": config.environment.docker_image}
    if "os" not in env.model_fields_set:
        update["os"] = config.environment.os
    return SeparateVerifier(config=env.model_copy(update=update), image=agent_image, bundled_tests=False)
