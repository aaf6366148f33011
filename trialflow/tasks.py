"""Harbor task loader: a task directory -> `Task`.

Layout (Harbor format)::

    task-name/
      task.toml              config (below); every section optional
      instruction.md         the prompt given to the agent (required, non-empty)
      environment/Dockerfile image to build (required unless [environment].docker_image)
      tests/test.sh          verifier entry point (required); writes /logs/verifier/reward.{txt,json}
      solution/solve.sh      reference solution (optional; the `oracle` scaffold needs it)

task.toml (Harbor's models, plus `workdir`)::

    version = "1.0"                 # also accepted as schema_version
    [task]      name = "org/name", description, authors = [{name, email}], keywords   (optional)
    [metadata]  free-form: author_name, difficulty, category, tags, ...
    [verifier]  timeout_sec = 600.0, env = {}, user = None (str or uid)
    [agent]     timeout_sec = None (no limit of its own), user = None
    [environment] build_timeout_sec = 600.0, docker_image = None, cpus = 1, memory_mb = 2048,
                  storage_mb = 10240, workdir = None, env = {}
                  (deprecated `memory = "2G"` / `storage = "10G"` are converted to *_mb)
    [solution]  env = {}

Edge cases:
- Unknown keys anywhere are kept (pydantic `extra="allow"`), listed in `Task.unknown_keys`
  as dotted paths and logged once at load; they never fail a load. Harbor fields we do not
  act on (gpus, allow_internet, network_mode, healthcheck, mcp_servers ...) land there too.
- Any invalid input raises `TaskInvalid(file=..., field=...)`; `environment/docker-compose.yaml`
  (or .yml) raises `UnsupportedEnvironment`.
- `Task.env_hash` hashes only environment/ (the image cache key: editing tests does not
  rebuild); `Task.content_hash` hashes the whole task. Both are stable across machines:
  sorted relative paths, file bytes and the executable bit; mtimes and owners are ignored;
  `__pycache__` dirs and `*.pyc` files are skipped.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import tomllib
from pathlib import Path
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from trialflow.errors import TaskInvalid, UnsupportedEnvironment

log = logging.getLogger(__name__)

TASK_TOML = "task.toml"
INSTRUCTION = "instruction.md"
DOCKERFILE = "environment/Dockerfile"
TEST_SCRIPT = "tests/test.sh"
SOLVE_SCRIPT = "solution/solve.sh"
COMPOSE_FILES = ("environment/docker-compose.yaml", "environment/docker-compose.yml")


class _Section(BaseModel):
    model_config = ConfigDict(extra="allow")


def _positive(cls: type, v: float | None) -> float | None:
    if v is not None and (not math.isfinite(v) or v <= 0):
        raise ValueError("must be a positive finite number")
    return v


def parse_size_mb(size: str) -> int:
    """'2G' -> 2048, '512M' -> 512, '1024K' -> 1. Case-insensitive; an optional trailing
    'B' ('2GB') is accepted. Raises ValueError for anything else or a non-positive size."""
    s = size.strip().upper().removesuffix("B")
    factors = {"G": 1024.0, "M": 1.0, "K": 1 / 1024}
    if not s or s[-1] not in factors:
        raise ValueError(f"invalid size {size!r}; expected like '2G', '512M'")
    try:
        mb = int(float(s[:-1]) * factors[s[-1]])
    except ValueError:
        raise ValueError(f"invalid size {size!r}; expected like '2G', '512M'") from None
    if mb <= 0:
        raise ValueError(f"size {size!r} is not positive")
    return mb


class Author(_Section):
    name: str
    email: str | None = None


class PackageInfo(_Section):
    name: str
    description: str = ""
    authors: list[Author] = Field(default_factory=list)
    keywords: list[str] = Field(default_factory=list)


class VerifierConfig(_Section):
    timeout_sec: float = 600.0
    env: dict[str, str] = Field(default_factory=dict)
    user: str | int | None = None

    _check_timeout = field_validator("timeout_sec")(_positive)


class AgentConfig(_Section):
    timeout_sec: float | None = None
    user: str | int | None = None

    _check_timeout = field_validator("timeout_sec")(_positive)


class EnvironmentConfig(_Section):
    build_timeout_sec: float = 600.0
    docker_image: str | None = None
    cpus: float = 1.0
    memory_mb: int = Field(default=2048, gt=0)
    storage_mb: int = Field(default=10240, gt=0)
    workdir: str | None = None
    env: dict[str, str] = Field(default_factory=dict)
    # Deprecated Harbor spellings; converted to *_mb and cleared.
    memory: str | None = Field(default=None, exclude=True)
    storage: str | None = Field(default=None, exclude=True)

    _check_timeout = field_validator("build_timeout_sec", "cpus")(_positive)

    @field_validator("workdir")
    @classmethod
    def _absolute_workdir(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith("/"):
            raise ValueError("must be an absolute path")
        return v

    @field_validator("memory", "storage")
    @classmethod
    def _size(cls, v: str | None) -> str | None:
        if v is not None:
            parse_size_mb(v)
        return v

    @model_validator(mode="after")
    def _convert_deprecated(self) -> EnvironmentConfig:
        if self.memory is not None:
            self.memory_mb, self.memory = parse_size_mb(self.memory), None
        if self.storage is not None:
            self.storage_mb, self.storage = parse_size_mb(self.storage), None
        return self


class SolutionConfig(_Section):
    env: dict[str, str] = Field(default_factory=dict)


class TaskConfig(_Section):
    version: str = "1.0"
    task: PackageInfo | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    verifier: VerifierConfig = Field(default_factory=VerifierConfig)
    agent: AgentConfig = Field(default_factory=AgentConfig)
    environment: EnvironmentConfig = Field(default_factory=EnvironmentConfig)
    solution: SolutionConfig = Field(default_factory=SolutionConfig)
    source: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _schema_version_alias(cls, data: Any) -> Any:
        # Newer Harbor renamed `version` to `schema_version`; accept both.
        if isinstance(data, dict) and "schema_version" in data and "version" not in data:
            data = {**data, "version": data["schema_version"]}
            del data["schema_version"]
        return data

    @field_validator("version", mode="before")
    @classmethod
    def _version_str(cls, v: Any) -> Any:
        return str(v) if isinstance(v, (int, float)) else v


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
    unknown_keys: tuple[str, ...] = ()

    @property
    def image_tag(self) -> str:
        """Local tag of the built task image; prebuilt `docker_image` wins when set."""
        return self.config.environment.docker_image or f"trialflow-task:{self.env_hash[:32]}"


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
    for compose in COMPOSE_FILES:
        if (root / compose).exists():
            raise UnsupportedEnvironment(
                f"{tdir}: docker-compose environments are not supported yet ({compose})"
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
        err = e.errors()[0]
        raise TaskInvalid(tdir, TASK_TOML, _field_path(err["loc"]), err["msg"]) from None

    instruction_path = root / INSTRUCTION
    if not instruction_path.is_file():
        raise TaskInvalid(tdir, INSTRUCTION, None, "file is missing")
    try:
        instruction = instruction_path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise TaskInvalid(tdir, INSTRUCTION, None, f"not UTF-8: {e}") from None
    if not instruction.strip():
        raise TaskInvalid(tdir, INSTRUCTION, None, "file is empty")

    dockerfile: Path | None = root / DOCKERFILE
    if not dockerfile.is_file():
        if config.environment.docker_image is None:
            raise TaskInvalid(
                tdir, DOCKERFILE, None, "file is missing and [environment].docker_image is not set"
            )
        dockerfile = None
    if not (root / TEST_SCRIPT).is_file():
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
        env_hash=hash_tree(root, ["environment"]),
        content_hash=hash_tree(root, [TASK_TOML, INSTRUCTION, "environment", "tests", "solution"]),
        unknown_keys=extras,
    )
