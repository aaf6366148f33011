"""environment/docker-compose.yaml -> `ComposeProject`, or why not (pure, reads files).

Harbor 0.25 (`harbor.environments.docker`) runs `docker compose up --detach --wait` on its
own `main` service (built from environment/, `sleep infinity`) with the task's file merged
over it; compose variables are the host's environment, the task's `[environment].env` and
Harbor's own (`MAIN_IMAGE_NAME`, `CONTEXT_DIR`, `PREBUILT_IMAGE_NAME`, `CPUS`, `MEMORY`:
`interpolation_env`). trialflow runs the services as containers in the sandbox's network
namespace (trialflow.sandbox.pod), so a file loads when every key it uses can be honoured
there. Two kinds of problem:

- `ComposeInvalid` (one, with its field path): what Compose itself rejects (bad YAML,
  types, durations, an unknown `depends_on` target, a dependency cycle, a bad
  interpolation).
- `ComposeRefused` (all of them): valid Compose that cannot be honoured in one shared,
  loopback-only namespace without weakening the sandbox: published `ports`,
  `network_mode`, networks other than `default`, `privileged`, `cap_add`,
  `security_opt`, devices and GPUs, host namespaces (`pid`, `ipc`, `userns_mode`, ...),
  named volumes, writable binds and binds outside environment/, build contexts outside
  it or that are URLs, two services exposing one port (one namespace: they would
  collide), replicas, `extends`/`include`/secrets/configs, overriding how `main` is built
  or run, and any key this module does not know.

Kept as Compose means them: `build` (context, dockerfile, args, target), `image`,
`command`/`entrypoint` (a string is split like a shell's words), `environment` (list or
map; a bare `KEY` takes the variable's value, unset: omitted), `env_file`, `working_dir`,
`user`, `healthcheck` (CMD / CMD-SHELL / string / NONE / `disable`), `depends_on` (short
and long syntax, conditions, `required`), `expose`, `init`, `tty`, `stdin_open`,
`read_only`, `stop_signal`, `restart`, `shm_size`, `mem_limit`, `cpus`, `pids_limit`,
`deploy.resources.limits`, `cap_drop`, `labels`, `profiles` (such a service is not
started, as `up` without `--profile`), read-only binds inside environment/, `tmpfs`,
anonymous volumes. Ignored: `logging`, `pull_policy`, `stop_grace_period`,
`healthcheck.start_interval` (the engine here, API 1.41, has none), `x-*` extensions,
`version`, `name`; `container_name` and `hostname` become extra names for the loopback
(the engine's container names stay trialflow's own).
"""

from __future__ import annotations

import platform
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from dotenv import dotenv_values

from trialflow.compose.keys import (
    IGNORED,
    PARSERS,
    REFUSED,
    ComposeInvalid,
    ComposeRefused,
    Context,
    Refusal,
    default_network_only,
    depends_on_of,
    pairs,
    top_level_refusal,
)
from trialflow.compose.spec import (
    MAIN,
    ComposeProject,
    ComposeService,
    Condition,
    Dependency,
)
from trialflow.compose.values import InterpolationError, interpolate, load_yaml

__all__ = ["ComposeInvalid", "ComposeRefused", "interpolation_env", "load_compose"]

COMPOSE_FILE = "docker-compose.yaml"  # the one name Harbor's docker environment reads
_SERVICE_NAME = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.-]*$")
_MAIN_KEYS = {"depends_on", "environment", "env_file", "expose"}


def interpolation_env(
    host_env: Mapping[str, str],
    task_env: Mapping[str, str],
    *,
    main_image: str,
    context_dir: Path,
    prebuilt_image: str | None = None,
    cpus: float | None = None,
    memory_mb: int | None = None,
) -> dict[str, str]:
    """Compose's variables as Harbor sets them: the host's, the task's `[environment].env`
    over them, Harbor's infrastructure variables over both (`ComposeInfraEnvVars`)."""
    infra = {"MAIN_IMAGE_NAME": main_image, "CONTEXT_DIR": str(context_dir)}
    if prebuilt_image:
        infra["PREBUILT_IMAGE_NAME"] = prebuilt_image
    if cpus is not None:
        infra["CPUS"] = str(cpus)
    if memory_mb is not None:
        infra["MEMORY"] = f"{memory_mb}M"
    return {**host_env, **task_env, **infra}


def load_compose(path: Path, env: Mapping[str, str], *, strict: bool = True) -> ComposeProject:
    """Parse and check `path` (module docstring). `env`: `interpolation_env`. Not strict:
    `${VAR?message}` with VAR unset gives "" (the task is loaded where its variables may
    not be set yet; set-up loads it strictly). Raises ComposeInvalid / ComposeRefused."""
    try:
        raw = load_yaml(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise ComposeInvalid("", f"not UTF-8: {e}") from None
    except yaml.YAMLError as e:
        raise ComposeInvalid("", f"YAML syntax error: {e}") from None
    if not isinstance(raw, dict):
        raise ComposeInvalid("", "the file must be a mapping with a 'services' key")
    doc = _interpolated(raw, env, strict, "")
    ctx = Context(path.parent.resolve(), env, strict)
    for key, value in doc.items():
        if key in ("services", "version", "name") or str(key).startswith("x-"):
            continue
        if key == "networks" and default_network_only(value):
            continue
        if key in ("volumes", "networks") and not value:
            continue
        ctx.refuse(str(key), top_level_refusal(str(key)))
    services = doc.get("services")
    if services is None:
        services = {}
    if not isinstance(services, dict):
        raise ComposeInvalid("services", "must be a mapping of service names")
    parsed: list[ComposeService] = []
    profiled: set[str] = set()
    main_cfg: dict[str, Any] = {}
    for name, cfg in services.items():
        if not isinstance(name, str) or not _SERVICE_NAME.match(name):
            raise ComposeInvalid(f"services.{name}", "invalid service name")
        cfg = {} if cfg is None else cfg
        if not isinstance(cfg, dict):
            raise ComposeInvalid(f"services.{name}", "must be a mapping")
        if name == MAIN:
            main_cfg = cfg
            continue
        if cfg.get("profiles"):
            profiled.add(name)  # `up` without --profile does not start it
            continue
        service = _service(name, cfg, ctx)
        if service is not None:
            parsed.append(service)
    for key in main_cfg:
        if key not in _MAIN_KEYS and not str(key).startswith("x-"):
            ctx.refuse(
                f"services.main.{key}",
                "the main service is built and run from environment/Dockerfile (or docker_image) "
                "and task.toml; a compose file may add only depends_on, environment, env_file and expose",
            )
    main_deps = depends_on_of(main_cfg.get("depends_on"), "services.main.depends_on")
    main_env = _environment(main_cfg, "services.main", ctx)
    names = {s.name for s in parsed}
    parsed = [
        s.model_copy(update={"depends_on": _resolve_deps(s.name, s.depends_on, names, profiled)})
        for s in parsed
    ]
    main_deps = _resolve_deps(MAIN, main_deps, names, profiled)
    for s in parsed:
        for dep, d in s.depends_on.items():
            if dep == MAIN and d.condition != Condition.STARTED:
                raise ComposeInvalid(
                    f"services.{s.name}.depends_on.main", f"{d.condition.value}: main has no healthcheck"
                )
    _check_exposed_ports(parsed, ctx)
    if ctx.refusals:
        raise ComposeRefused(ctx.refusals)
    deps = {s.name: s.depends_on for s in parsed} | {MAIN: main_deps}
    return ComposeProject(
        path=path,
        services=tuple(parsed),
        main_depends_on=main_deps,
        main_environment=main_env,
        order=_start_order(deps),
    )


def _interpolated(value: Any, env: Mapping[str, str], strict: bool, field: str) -> Any:
    if isinstance(value, str):
        try:
            return interpolate(value, env, strict=strict)
        except InterpolationError as e:
            raise ComposeInvalid(field, str(e)) from None
    if isinstance(value, dict):
        return {k: _interpolated(v, env, strict, f"{field}.{k}".lstrip(".")) for k, v in value.items()}
    if isinstance(value, list):
        return [_interpolated(v, env, strict, f"{field}[{i}]") for i, v in enumerate(value)]
    return value


def _service(name: str, cfg: dict[str, Any], ctx: Context) -> ComposeService | None:
    """One service's keys, each checked; refusals are collected in `ctx`."""
    out: dict[str, Any] = {"name": name}
    where = f"services.{name}"
    for key, value in cfg.items():
        key = str(key)
        field = f"{where}.{key}"
        try:
            if key.startswith("x-") or key in IGNORED:
                continue
            if key in REFUSED:
                raise Refusal(f"{field}: {REFUSED[key]}")
            parser = PARSERS.get(key)
            if parser is None:
                raise Refusal(f"{field}: not a key trialflow's compose environments support")
            parser(value, field, ctx, out)
        except Refusal as r:
            ctx.refusals.append(str(r))
    if "image" not in out and "build" not in out:
        raise ComposeInvalid(where, "has neither image nor build")
    out["environment"] = _environment(cfg, where, ctx)
    out["aliases"] = tuple(
        str(cfg[k]) for k in ("container_name", "hostname") if cfg.get(k) and str(cfg[k]) != name
    )
    if "platform" in cfg and not _host_platform(str(cfg["platform"])):
        ctx.refuse(f"{where}.platform", f"{cfg['platform']!r} is not this host's platform")
    return ComposeService(**out)


def _host_platform(value: str) -> bool:
    arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())
    return value.split("/")[:2] in (["linux", arch], ["linux", platform.machine()])


def _environment(cfg: dict[str, Any], where: str, ctx: Context) -> dict[str, str]:
    """env_file entries, then `environment` over them; a key without a value takes the
    variable's, and is left out when it has none."""
    merged: dict[str, str | None] = {}
    files = cfg.get("env_file")
    entries = [] if files is None else [files] if isinstance(files, str | dict) else files
    if not isinstance(entries, list):
        raise ComposeInvalid(f"{where}.env_file", "must be a path or a list of paths")
    for i, entry in enumerate(entries):
        field = f"{where}.env_file[{i}]"
        rel, required = (
            (entry.get("path"), entry.get("required", True)) if isinstance(entry, dict) else (entry, True)
        )
        if not isinstance(rel, str):
            raise ComposeInvalid(field, "must be a path")
        try:
            path = ctx.inside(rel, field)
        except Refusal as r:
            ctx.refusals.append(str(r))
            continue
        if not path.is_file():
            if required:
                raise ComposeInvalid(field, f"{rel}: file not found")
            continue
        for key, val in dotenv_values(path, interpolate=False).items():
            try:
                merged[key] = None if val is None else interpolate(val, ctx.env, strict=ctx.strict)
            except InterpolationError as e:
                raise ComposeInvalid(field, str(e)) from None
    merged.update(pairs(cfg.get("environment"), f"{where}.environment"))
    out: dict[str, str] = {}
    for key, val in merged.items():
        if val is not None:
            out[key] = val
        elif key in ctx.env:
            out[key] = ctx.env[key]
    return out


def _resolve_deps(
    name: str, deps: dict[str, Dependency], names: set[str], profiled: set[str]
) -> dict[str, Dependency]:
    """Drop optional dependencies that will not run; refuse required unknown ones."""
    out = {}
    where = f"services.{name}.depends_on"
    for dep, d in deps.items():
        if dep in names or dep == MAIN:
            if dep == name:
                raise ComposeInvalid(f"{where}.{dep}", "a service cannot depend on itself")
            out[dep] = d
        elif not d.required:
            continue
        elif dep in profiled:
            raise ComposeInvalid(f"{where}.{dep}", "depends on a service that only starts with a profile")
        else:
            raise ComposeInvalid(f"{where}.{dep}", "depends on an undefined service")
    return out


def _start_order(deps: dict[str, dict[str, Dependency]]) -> tuple[str, ...]:
    """Each name after its dependencies (stable: file order otherwise). A cycle is invalid."""
    order: list[str] = []
    state: dict[str, str] = {}

    def visit(n: str, path: list[str]) -> None:
        if state.get(n) == "done":
            return
        if state.get(n) == "visiting":
            cycle = " -> ".join([*path[path.index(n) :], n])
            raise ComposeInvalid(f"services.{n}.depends_on", f"dependency cycle: {cycle}")
        state[n] = "visiting"
        for d in deps[n]:
            visit(d, [*path, n])
        state[n] = "done"
        order.append(n)

    for n in deps:
        visit(n, [])
    return tuple(order)


def _check_exposed_ports(services: list[ComposeService], ctx: Context) -> None:
    owner: dict[str, str] = {}
    for s in services:
        for port in s.expose:
            if port in owner and owner[port] != s.name:
                ctx.refuse(
                    f"services.{s.name}.expose",
                    f"port {port} is also exposed by {owner[port]}: in the one network namespace "
                    "services share, both cannot listen on it",
                )
            owner.setdefault(port, s.name)
