"""The keys of a compose service, one parser each, and the refusals (pure; used by
`trialflow.compose.load`, whose docstring says what is kept and what refused).

A parser takes (value, field, ctx, out): it checks one key's value, raises
`ComposeInvalid` for what Compose rejects or `Refusal` for what cannot be honoured (the
caller collects those), and writes `ComposeService` fields into `out`.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from trialflow.compose.spec import BindMount, Condition, Dependency, ServiceBuild, ServiceHealthcheck
from trialflow.compose.values import parse_bytes, parse_duration


class ComposeInvalid(ValueError):
    """Compose rejects the file. `field` is a dotted path into it ("" for the whole file)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}" if field else message)
        self.field, self.message = field, message


class ComposeRefused(ValueError):
    """The file is valid Compose that trialflow cannot honour; `reasons`, one per key."""

    def __init__(self, reasons: list[str]) -> None:
        super().__init__("; ".join(reasons))
        self.reasons = reasons


HOST_NS = "joins a namespace of the host, which sandboxes never do"
REFUSED = {
    "ports": "ports published on the host are refused: services reach each other on the sandbox's "
    "loopback, and nothing is published",
    "network_mode": "the service shares the sandbox's network namespace; another network mode cannot be "
    "honoured",
    "cap_add": "capabilities beyond the sandbox's are refused",
    "security_opt": "security options would replace the sandbox's seccomp profile and no-new-privileges",
    "devices": "devices are not passed to sandboxes",
    "device_cgroup_rules": "devices are not passed to sandboxes",
    "gpus": "sandboxes get no GPUs",
    "pid": HOST_NS,
    "ipc": HOST_NS,
    "uts": HOST_NS,
    "userns_mode": HOST_NS,
    "cgroup": HOST_NS,
    "cgroup_parent": "a cgroup of the host's is refused",
    "sysctls": "sysctls would change the shared namespace the agent also uses",
    "extra_hosts": "names resolve to the shared loopback only",
    "dns": "sandboxes have no DNS",
    "dns_search": "sandboxes have no DNS",
    "dns_opt": "sandboxes have no DNS",
    "links": "services reach each other by name on the shared loopback; links are not needed",
    "external_links": "containers outside the task are not reachable",
    "volumes_from": "containers share no volumes",
    "secrets": "secrets are not supported",
    "configs": "configs are not supported",
    "extends": "extends is not supported",
    "post_start": "lifecycle hooks are not supported",
    "pre_stop": "lifecycle hooks are not supported",
    "runtime": "the sandbox's runtime is the backend's",
    "isolation": "the sandbox's runtime is the backend's",
    "scale": "one container per service: replicas would collide in the shared namespace",
}
IGNORED = {"logging", "pull_policy", "stop_grace_period", "container_name", "hostname", "platform"}


class Context:
    """What a parse needs besides the file: environment/ (the bound for paths), the
    variables, and the refusals found so far."""

    def __init__(self, env_dir: Path, env: Mapping[str, str], strict: bool) -> None:
        self.env_dir, self.env, self.strict = env_dir, env, strict
        self.refusals: list[str] = []

    def refuse(self, field: str, reason: str) -> None:
        self.refusals.append(f"{field}: {reason}")

    def inside(self, rel: str, field: str) -> Path:
        """`rel` resolved against environment/ (links followed); refused when it leaves it."""
        p = (self.env_dir / rel).resolve()
        if not p.is_relative_to(self.env_dir):
            raise Refusal(f"{field}: {rel!r} is outside the task's environment/ directory")
        return p


class Refusal(Exception):
    """Raised by a key's parser when the key cannot be honoured (collected, not fatal)."""


def top_level_refusal(key: str) -> str:
    return {
        "volumes": "named volumes are not supported (a service may use anonymous volumes, tmpfs and "
        "read-only binds inside environment/)",
        "networks": "networks other than the default are refused: every service shares the sandbox's "
        "network namespace, and no bridge network is ever created",
        "include": "include is not supported",
        "secrets": "secrets are not supported",
        "configs": "configs are not supported",
    }.get(key, "not a key trialflow's compose environments support")


def default_network_only(value: Any) -> bool:
    if isinstance(value, list):
        return all(v == "default" for v in value)
    if isinstance(value, dict):
        return all(k == "default" and not v for k, v in value.items())
    return value is None


Parser = Callable[[Any, str, "Context", dict[str, Any]], None]


def strs(value: Any, field: str) -> tuple[str, ...] | None:
    """A command: None, a string (split like a shell's words) or a list of strings."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            return tuple(shlex.split(value))
        except ValueError as e:
            raise ComposeInvalid(field, str(e)) from None
    if isinstance(value, list) and all(isinstance(v, str | int | float) for v in value):
        return tuple(str(v) for v in value)
    raise ComposeInvalid(field, "must be a string or a list of strings")


def scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def pairs(value: Any, field: str) -> dict[str, str | None]:
    """Compose's list-or-map form (`environment`, `labels`, build `args`): "K=V" / "K",
    or {K: V | null}."""
    if value is None:
        return {}
    if isinstance(value, dict):
        return {str(k): None if v is None else scalar(v) for k, v in value.items()}
    if isinstance(value, list):
        out: dict[str, str | None] = {}
        for item in value:
            if not isinstance(item, str):
                raise ComposeInvalid(field, f"entry {item!r} must be a string")
            key, eq, val = item.partition("=")
            out[key] = val if eq else None
        return out
    raise ComposeInvalid(field, "must be a list or a mapping")


def depends_on_of(value: Any, field: str) -> dict[str, Dependency]:
    if value is None:
        return {}
    if isinstance(value, list):
        if not all(isinstance(v, str) for v in value):
            raise ComposeInvalid(field, "must list service names")
        return {v: Dependency() for v in value}
    if not isinstance(value, dict):
        raise ComposeInvalid(field, "must be a list or a mapping")
    out = {}
    for dep, spec in value.items():
        spec = spec or {}
        if not isinstance(spec, dict):
            raise ComposeInvalid(f"{field}.{dep}", "must be a mapping")
        try:
            condition = Condition(spec.get("condition", Condition.STARTED.value))
        except ValueError:
            raise ComposeInvalid(
                f"{field}.{dep}.condition",
                f"{spec.get('condition')!r}: must be one of {[c.value for c in Condition]}",
            ) from None
        required = spec.get("required", True)
        if not isinstance(required, bool):
            raise ComposeInvalid(f"{field}.{dep}.required", "must be true or false")
        out[str(dep)] = Dependency(condition=condition, required=required)
    return out


# -- one parser per supported key: (value, field, ctx, out) ------------------------------


def _p_image(value: Any, field: str, ctx: Context, out: dict[str, Any]) -> None:
    if not isinstance(value, str) or not value:
        raise ComposeInvalid(field, "must be an image name")
    out["image"] = value


def _p_build(value: Any, field: str, ctx: Context, out: dict[str, Any]) -> None:
    cfg = {"context": value} if isinstance(value, str) else value
    if not isinstance(cfg, dict):
        raise ComposeInvalid(field, "must be a path or a mapping")
    for key in cfg:
        if key not in ("context", "dockerfile", "args", "target", "network", "labels"):
            raise Refusal(
                f"{field}.{key}: not supported (trialflow builds with context, dockerfile, args, target)"
            )
    context = cfg.get("context", ".")
    if not isinstance(context, str) or re.match(r"^[a-z][a-z0-9+.-]*://|^git@", context):
        raise Refusal(f"{field}.context: {context!r}: only a directory inside environment/ can be built here")
    ctx_dir = ctx.inside(context, f"{field}.context")
    if not ctx_dir.is_dir():
        raise ComposeInvalid(f"{field}.context", f"{context}: directory not found")
    dockerfile = (ctx_dir / str(cfg.get("dockerfile", "Dockerfile"))).resolve()
    if not dockerfile.is_relative_to(ctx.env_dir):
        raise Refusal(f"{field}.dockerfile: outside the task's environment/ directory")
    if not dockerfile.is_file():
        raise ComposeInvalid(f"{field}.dockerfile", f"{dockerfile.name}: file not found")
    args = {
        k: v if v is not None else ctx.env.get(k, "")
        for k, v in pairs(cfg.get("args"), f"{field}.args").items()
    }
    target = cfg.get("target")
    out["build"] = ServiceBuild(
        context=ctx_dir, dockerfile=dockerfile, args=args, target=None if target is None else str(target)
    )


def _p_command(value: Any, field: str, ctx: Context, out: dict[str, Any]) -> None:
    out[field.rsplit(".", 1)[1]] = strs(value, field)


def _p_str(value: Any, field: str, ctx: Context, out: dict[str, Any]) -> None:
    if value is not None:
        if not isinstance(value, str | int):
            raise ComposeInvalid(field, "must be a string")
        out[field.rsplit(".", 1)[1]] = str(value)


def _p_bool(value: Any, field: str, ctx: Context, out: dict[str, Any]) -> None:
    if not isinstance(value, bool):
        raise ComposeInvalid(field, "must be true or false")
    out[field.rsplit(".", 1)[1]] = value


def _p_healthcheck(value: Any, field: str, ctx: Context, out: dict[str, Any]) -> None:
    if not isinstance(value, dict):
        raise ComposeInvalid(field, "must be a mapping")
    hc: dict[str, Any] = {}
    test = value.get("test")
    if value.get("disable") is True:
        hc["test"] = ("NONE",)
    elif isinstance(test, str):
        hc["test"] = ("CMD-SHELL", test)
    elif isinstance(test, list) and test and all(isinstance(t, str) for t in test):
        if test[0] == "NONE":
            hc["test"] = ("NONE",)
        elif test[0] == "CMD" and len(test) > 1:
            hc["test"] = tuple(test)
        elif test[0] == "CMD-SHELL" and len(test) > 1:
            hc["test"] = ("CMD-SHELL", " ".join(test[1:]))
        else:
            raise ComposeInvalid(f"{field}.test", "must start with CMD, CMD-SHELL or NONE and name a command")
    elif test is not None:
        raise ComposeInvalid(f"{field}.test", "must be a string or a list of strings")
    for key in ("interval", "timeout", "start_period", "start_interval"):
        if value.get(key) is not None:
            try:
                seconds = parse_duration(value[key])
            except ValueError as e:
                raise ComposeInvalid(f"{field}.{key}", str(e)) from None
            if key != "start_interval":  # the engine here (API 1.41) has no start interval
                hc[f"{key}_s"] = seconds
    if value.get("retries") is not None:
        if (
            not isinstance(value["retries"], int)
            or isinstance(value["retries"], bool)
            or value["retries"] < 0
        ):
            raise ComposeInvalid(f"{field}.retries", "must be a non-negative integer")
        hc["retries"] = value["retries"]
    unknown = set(value) - {
        "test",
        "disable",
        "interval",
        "timeout",
        "start_period",
        "start_interval",
        "retries",
    }
    if unknown:
        raise ComposeInvalid(f"{field}.{sorted(unknown)[0]}", "not a healthcheck key")
    out["healthcheck"] = ServiceHealthcheck(**hc)


def _p_depends_on(value: Any, field: str, ctx: Context, out: dict[str, Any]) -> None:
    out["depends_on"] = depends_on_of(value, field)


def size(value: Any, field: str) -> int:
    try:
        return parse_bytes(value)
    except ValueError as e:
        raise ComposeInvalid(field, str(e)) from None


def _p_size(value: Any, field: str, ctx: Context, out: dict[str, Any]) -> None:
    out[field.rsplit(".", 1)[1]] = size(value, field)


def _p_cpus(value: Any, field: str, ctx: Context, out: dict[str, Any]) -> None:
    try:
        cpus = float(value)
    except (TypeError, ValueError):
        raise ComposeInvalid(field, "must be a number") from None
    if cpus > 0:
        out["cpus"] = cpus


def _p_pids(value: Any, field: str, ctx: Context, out: dict[str, Any]) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ComposeInvalid(field, "must be an integer")
    if value > 0:
        out["pids_limit"] = value


def _p_privileged(value: Any, field: str, ctx: Context, out: dict[str, Any]) -> None:
    if value is True:
        raise Refusal(f"{field}: privileged containers are refused")


def _p_networks(value: Any, field: str, ctx: Context, out: dict[str, Any]) -> None:
    if not default_network_only(value):
        raise Refusal(f"{field}: {top_level_refusal('networks')}")


def _p_cap_drop(value: Any, field: str, ctx: Context, out: dict[str, Any]) -> None:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ComposeInvalid(field, "must list capabilities")
    out["cap_drop"] = tuple(v.upper().removeprefix("CAP_") for v in value)


def _p_labels(value: Any, field: str, ctx: Context, out: dict[str, Any]) -> None:
    out["labels"] = {k: v or "" for k, v in pairs(value, field).items()}


def _p_restart(value: Any, field: str, ctx: Context, out: dict[str, Any]) -> None:
    text = str(value)
    if text == "no":
        return
    if text not in ("always", "unless-stopped", "on-failure") and not re.fullmatch(r"on-failure:\d+", text):
        raise ComposeInvalid(field, f"{text!r}: must be no, always, on-failure[:N] or unless-stopped")
    out["restart"] = text


def _p_expose(value: Any, field: str, ctx: Context, out: dict[str, Any]) -> None:
    if not isinstance(value, list):
        raise ComposeInvalid(field, "must be a list of ports")
    out["expose"] = tuple(str(p).split("/")[0] for p in value)


def _p_tmpfs(value: Any, field: str, ctx: Context, out: dict[str, Any]) -> None:
    paths = [value] if isinstance(value, str) else value
    if not isinstance(paths, list):
        raise ComposeInvalid(field, "must be a path or a list of paths")
    out["tmpfs"] = (*out.get("tmpfs", ()), *(str(p).split(":")[0] for p in paths))


def _p_volumes(value: Any, field: str, ctx: Context, out: dict[str, Any]) -> None:
    if not isinstance(value, list):
        raise ComposeInvalid(field, "must be a list")
    binds: list[BindMount] = list(out.get("binds", ()))
    tmpfs: list[str] = list(out.get("tmpfs", ()))
    anonymous: list[str] = []
    for i, v in enumerate(value):
        try:
            _volume(v, f"{field}[{i}]", ctx, binds, tmpfs, anonymous)
        except Refusal as r:  # every entry is checked
            ctx.refusals.append(str(r))
    out["binds"], out["tmpfs"], out["anonymous_volumes"] = tuple(binds), tuple(tmpfs), tuple(anonymous)


def _volume(
    v: Any, f: str, ctx: Context, binds: list[BindMount], tmpfs: list[str], anonymous: list[str]
) -> None:
    """One `volumes` entry (short "src:dst[:mode]" or long syntax) into its kind's list."""
    source: Any
    target: Any
    if isinstance(v, str):
        parts = v.split(":")
        if len(parts) == 1:
            anonymous.append(parts[0])
            return
        source, target, mode = parts[0], parts[1], (parts[2] if len(parts) > 2 else "rw")
        kind = "bind" if source.startswith((".", "/", "~")) else "volume"
        read_only = "ro" in mode.split(",")
    elif isinstance(v, dict):
        kind, source, target = v.get("type", "volume"), v.get("source"), v.get("target")
        read_only = bool(v.get("read_only", False))
        if not isinstance(target, str):
            raise ComposeInvalid(f"{f}.target", "must be a container path")
    else:
        raise ComposeInvalid(f, "must be a string or a mapping")
    if kind == "tmpfs":
        tmpfs.append(target)
    elif kind == "volume" and not source:
        anonymous.append(target)
    elif kind == "volume":
        raise Refusal(f"{f}: named volume {source!r}: named volumes are not supported")
    elif kind != "bind":
        raise Refusal(f"{f}: volume type {kind!r} is not supported")
    elif not read_only:
        raise Refusal(
            f"{f}: a writable bind mount would let the sandbox change the task's files on the host; "
            "mount it read-only (:ro)"
        )
    else:
        binds.append(BindMount(source=ctx.inside(str(source), f), target=target))


def _p_deploy(value: Any, field: str, ctx: Context, out: dict[str, Any]) -> None:
    if not isinstance(value, dict):
        raise ComposeInvalid(field, "must be a mapping")
    for key, v in value.items():
        if key == "replicas":
            if v not in (0, 1):
                raise Refusal(f"{field}.replicas: {REFUSED['scale']}")
        elif key == "resources":
            limits = (v or {}).get("limits") or {}
            if ((v or {}).get("reservations") or {}).get("devices"):
                raise Refusal(f"{field}.resources.reservations.devices: devices are not passed to sandboxes")
            if limits.get("cpus") is not None:
                _p_cpus(limits["cpus"], f"{field}.resources.limits.cpus", ctx, out)
            if limits.get("memory") is not None:
                out["mem_limit"] = size(limits["memory"], f"{field}.resources.limits.memory")
            if limits.get("pids") is not None:
                _p_pids(limits["pids"], f"{field}.resources.limits.pids", ctx, out)
        else:
            raise Refusal(f"{field}.{key}: not supported (only deploy.resources and replicas 0 or 1)")


PARSERS: dict[str, Parser] = {
    "image": _p_image,
    "build": _p_build,
    "command": _p_command,
    "entrypoint": _p_command,
    "environment": lambda *a: None,  # with env_file, in _environment
    "env_file": lambda *a: None,
    "working_dir": _p_str,
    "user": _p_str,
    "stop_signal": _p_str,
    "healthcheck": _p_healthcheck,
    "depends_on": _p_depends_on,
    "init": _p_bool,
    "tty": _p_bool,
    "stdin_open": _p_bool,
    "read_only": _p_bool,
    "privileged": _p_privileged,
    "restart": _p_restart,
    "shm_size": _p_size,
    "mem_limit": _p_size,
    "cpus": _p_cpus,
    "pids_limit": _p_pids,
    "cap_drop": _p_cap_drop,
    "labels": _p_labels,
    "tmpfs": _p_tmpfs,
    "volumes": _p_volumes,
    "deploy": _p_deploy,
    "profiles": lambda *a: None,
    "networks": _p_networks,
    # changes nothing at run time (every port is reachable in the shared namespace), but two
    # services exposing one port would collide there
    "expose": _p_expose,
}
