"""Compose's value rules (pure): its YAML, variable interpolation, durations, byte sizes.

- **YAML**: Compose reads YAML 1.2, so `yes`/`no`/`on`/`off` are strings and `1:30` is not
  a base-60 number; PyYAML's safe loader speaks YAML 1.1. `load_yaml` uses a safe loader
  whose booleans, integers and floats are YAML 1.2's core schema (anchors and `<<` merge
  keys work as in the safe loader).
- **Interpolation** (Compose spec, "Interpolation"), on every string value: `$$` is a
  literal `$`; `$VAR` and `${VAR}`; `${VAR:-default}` (unset or empty), `${VAR-default}`
  (unset); `${VAR:?message}` / `${VAR?message}` fail; `${VAR:+alt}` / `${VAR+alt}`
  substitute `alt` when set (and non-empty). A default may itself interpolate
  (`${A:-${B}}`). An unset variable without a default is "" (Compose warns). Malformed text
  (`${`, `${1X}`) raises `InterpolationError`, as do the `?` forms when `strict`; not
  strict (a task loaded where the variable may not be set yet), they give "".
- **Durations** (healthcheck intervals, ...): Go's `time.ParseDuration`, which Compose
  uses: a sequence of decimal numbers with units ns, us/µs, ms, s, m, h (`1m30s`, `1.5h`,
  `500ms`); a bare `0` is zero; a number without a unit is an error (Compose's too).
- **Byte sizes** (`mem_limit`, `shm_size`): an integer is bytes; a string is a number with
  an optional unit b, k, m, g, t, p (optionally followed by `b`, `i` or `ib`), powers of
  1024, as docker/go-units `RAMInBytes`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import yaml

__all__ = ["InterpolationError", "interpolate", "load_yaml", "parse_bytes", "parse_duration"]


class InterpolationError(ValueError):
    """A string Compose cannot interpolate, or a `${VAR?message}` with VAR unset."""


class _ComposeLoader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2 core scalars (see the module docstring)."""


_CORE = {
    "tag:yaml.org,2002:bool": r"^(?:true|True|TRUE|false|False|FALSE)$",
    "tag:yaml.org,2002:int": r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$",
    "tag:yaml.org,2002:float": r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
    r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$",
}
_ComposeLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag not in _CORE]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
for _tag, _rx in _CORE.items():
    _ComposeLoader.add_implicit_resolver(_tag, re.compile(_rx), list("-+0123456789.tTfF"))


def _int(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> int:
    text = str(loader.construct_scalar(node))
    return int(text, 0) if text[:2] in ("0o", "0x") else int(text, 10)


def _bool(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> bool:
    return str(loader.construct_scalar(node)).lower() == "true"


_ComposeLoader.add_constructor("tag:yaml.org,2002:int", _int)
_ComposeLoader.add_constructor("tag:yaml.org,2002:bool", _bool)


def load_yaml(text: str) -> Any:
    """Parse `text` as Compose does (YAML 1.2 scalars). Raises yaml.YAMLError."""
    return yaml.load(text, Loader=_ComposeLoader)  # noqa: S506 - a SafeLoader subclass


_NAME = re.compile(r"[_a-zA-Z][_a-zA-Z0-9]*")


def interpolate(text: str, env: Mapping[str, str], *, strict: bool = True) -> str:
    """`text` with Compose's variable references replaced from `env` (module docstring)."""
    out, _ = _scan(text, 0, env, strict, nested=False)
    return out


def _scan(text: str, i: int, env: Mapping[str, str], strict: bool, *, nested: bool) -> tuple[str, int]:
    """Interpolate from `i`; a nested scan (a default's text) stops at its closing `}`."""
    out: list[str] = []
    while i < len(text):
        c = text[i]
        if nested and c == "}":
            return "".join(out), i
        if c != "$":
            out.append(c)
            i += 1
            continue
        nxt = text[i + 1] if i + 1 < len(text) else ""
        if nxt == "$":
            out.append("$")
            i += 2
        elif nxt == "{":
            value, i = _braced(text, i + 2, env, strict)
            out.append(value)
        elif m := _NAME.match(text, i + 1):
            out.append(env.get(m.group(), ""))
            i = m.end()
        else:
            raise InterpolationError(f"invalid interpolation format in {text!r}: a lone '$' (write '$$')")
    if nested:
        raise InterpolationError(f"invalid interpolation format in {text!r}: '${{' is not closed")
    return "".join(out), i


def _braced(text: str, i: int, env: Mapping[str, str], strict: bool) -> tuple[str, int]:
    """`${...}` starting after the brace; returns the value and the index past `}`."""
    m = _NAME.match(text, i)
    if m is None:
        raise InterpolationError(f"invalid interpolation format in {text!r}: bad variable name")
    name, i = m.group(), m.end()
    if i < len(text) and text[i] == "}":
        return env.get(name, ""), i + 1
    op = next((o for o in (":-", ":?", ":+", "-", "?", "+") if text.startswith(o, i)), None)
    if op is None:
        raise InterpolationError(f"invalid interpolation format in {text!r}: '${{{name}' is not closed")
    arg, end = _scan(text, i + len(op), env, strict, nested=True)
    value = env.get(name)
    present = value is not None and (value != "" or ":" not in op)
    if op.endswith("-"):
        return (value if present else arg) or "", end + 1
    if op.endswith("+"):
        return (arg if present else ""), end + 1
    if not present and strict:
        raise InterpolationError(f"required variable {name} is missing a value: {arg or name}")
    return value or "", end + 1


_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
_UNIT_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(value: object) -> float:
    """Seconds of a Go duration string (`1m30s` -> 90.0). Raises ValueError."""
    text = str(value).strip()
    if text == "0":
        return 0.0
    pos, total = 0, 0.0
    for m in _DURATION.finditer(text):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNIT_S[m.group(2)]
        pos = m.end()
    if pos != len(text) or not text:
        raise ValueError(f"{value!r} is not a duration (e.g. 30s, 1m30s, 500ms)")
    return total


_BYTES = re.compile(r"^(\d+(?:\.\d+)?) ?([bkmgtp])?(?:i?b)?$", re.IGNORECASE)


def parse_bytes(value: object) -> int:
    """Bytes of a Compose size (`512m`, `1g`, `1GiB`, 1048576). Raises ValueError."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a size")
    if isinstance(value, int):
        return value
    m = _BYTES.match(str(value).strip())
    if m is None:
        raise ValueError(f"{value!r} is not a size (e.g. 512m, 2g)")
    power = " bkmgtp".index((m.group(2) or "b").lower()) - 1
    return int(float(m.group(1)) * 1024**power)
