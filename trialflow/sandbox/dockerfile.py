"""What a Dockerfile asks of the engine, read before building (pure: text in, facts out).

`parse(text)` -> `DockerfileFacts`: the images it brings in from outside (each `FROM` that is
not an earlier stage or `scratch`, each `COPY --from=` that names an image rather than a
stage), with the ARGs declared before the first FROM substituted (a compose service's build
arguments where it gives them, else the ARG's default: a task's own build gets no build
arguments); and what the engine's builder refuses,
one line each. `rewrite(text, {ref: name})` gives the same Dockerfile with those images
renamed (offline stand-ins), every other byte unchanged.

The builder is the Docker engine's classic one (the docker SDK's `/build`; BuildKit needs a
session the SDK does not speak). Measured on Docker 20.10: `RUN --mount`/`--network`/
`--security`, `COPY`/`ADD --chmod`, `--link`, `--checksum`, `--parents`, `--exclude`,
`HEALTHCHECK --start-interval` and heredocs (`RUN <<EOF`) are refused ("requires BuildKit",
"Unknown flag", or the heredoc's body read as instructions: "unknown instruction: ECHO"),
as is any unknown instruction. Harbor builds with compose (BuildKit), so such a task is valid
for Harbor and refused here, before anything is built, naming the line.

Edge cases: instructions are case-insensitive, a line ending in the escape character
(`\\`, or the `# escape=` directive's) continues the instruction, comment lines inside a
continued instruction are dropped as the builder does; `FROM x AS name` names a stage that
later `FROM name` / `COPY --from=name` (or `--from=<index>`) refer to; a `$VAR` in an image
reference without a value is a problem (the builder would see an empty name).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

__all__ = ["DockerfileFacts", "ImageUse", "parse", "rewrite"]

# The classic builder's instructions (moby's builder/dockerfile/instructions).
INSTRUCTIONS = frozenset(
    "ADD ARG CMD COPY ENTRYPOINT ENV EXPOSE FROM HEALTHCHECK LABEL MAINTAINER ONBUILD RUN SHELL "
    "STOPSIGNAL USER VOLUME WORKDIR".split()
)
# Flags it knows per instruction; a flag not listed is refused by the engine.
FLAGS: dict[str, frozenset[str]] = {
    "FROM": frozenset({"platform"}),
    "COPY": frozenset({"from", "chown"}),
    "ADD": frozenset({"chown"}),
    "HEALTHCHECK": frozenset({"interval", "timeout", "start-period", "retries"}),
}
# Flags BuildKit has and the classic builder refuses: said as such, the fix is not a typo.
BUILDKIT_FLAGS: dict[str, frozenset[str]] = {
    "RUN": frozenset({"mount", "network", "security"}),
    "COPY": frozenset({"chmod", "link", "parents", "exclude"}),
    "ADD": frozenset({"chmod", "link", "checksum", "keep-git-dir", "exclude"}),
    "HEALTHCHECK": frozenset({"start-interval"}),
}
_DIRECTIVE = re.compile(r"^#\s*(\w+)\s*=\s*(\S+)\s*$")
_HEREDOC = re.compile(r"(?:^|\s)<<-?[\"']?([A-Za-z_]\w*)[\"']?(?=\s|$)")
_VAR = re.compile(r"\$(?:\{(\w+)(?::([-+])([^}]*))?\}|(\w+))")


@dataclass(frozen=True)
class ImageUse:
    """An image a Dockerfile brings in: `ref` with ARG defaults substituted; `line` 1-based."""

    ref: str
    line: int
    kind: Literal["FROM", "COPY --from"]


@dataclass(frozen=True)
class DockerfileFacts:
    images: tuple[ImageUse, ...]  # in order of appearance, repeats kept
    problems: tuple[str, ...]  # "line N: ..." for what the builder refuses

    @property
    def refs(self) -> list[str]:
        """The distinct image references, in order of first use."""
        return list(dict.fromkeys(u.ref for u in self.images))


@dataclass(frozen=True)
class _Instruction:
    keyword: str  # upper case
    flags: tuple[tuple[str, str | None, str], ...]  # (name, value, the raw token)
    args: str  # the rest, continuation lines joined
    first: int  # 0-based physical line of the keyword
    last: int  # 0-based physical line where it ends


def _instructions(text: str) -> list[_Instruction]:
    lines = text.splitlines()
    escape = "\\"
    i = 0
    # Parser directives: only at the very top, before any other line.
    while i < len(lines) and (m := _DIRECTIVE.match(lines[i].strip())):
        if m.group(1).lower() == "escape" and m.group(2) in ("\\", "`"):
            escape = m.group(2)
        i += 1
    out = []
    while i < len(lines):
        stripped = lines[i].strip()
        if not stripped or stripped.startswith("#"):
            i += 1
            continue
        first, parts = i, []
        while True:
            line = lines[i].rstrip()
            if line.endswith(escape) and i + 1 < len(lines):
                parts.append(line[: -len(escape)])
                i += 1
                while i < len(lines) and lines[i].strip().startswith("#"):
                    i += 1  # a comment inside a continued instruction is dropped
                if i >= len(lines):
                    break
                continue
            parts.append(line)
            break
        joined = " ".join(p.strip() for p in parts).strip()
        keyword, _, rest = joined.partition(" ")
        flags = []
        tokens = rest.split()
        while tokens and tokens[0].startswith("--"):
            raw = tokens.pop(0)
            name, eq, value = raw[2:].partition("=")
            flags.append((name.lower(), value if eq else None, raw))
        out.append(_Instruction(keyword.upper(), tuple(flags), " ".join(tokens), first, i))
        i += 1
        if keyword.upper() in ("RUN", "COPY", "ADD"):  # a heredoc's body is not instructions
            for delimiter in _HEREDOC.findall(joined):
                while i < len(lines) and lines[i].strip() != delimiter:
                    i += 1
                i += 1
    return out


def _substitute(ref: str, args: Mapping[str, str]) -> tuple[str, list[str]]:
    """`ref` with ARG values put in; the names left without a value."""
    missing: list[str] = []

    def one(m: re.Match[str]) -> str:
        name, op, word = m.group(1) or m.group(4), m.group(2), m.group(3) or ""
        value = args.get(name)
        if op == "-":
            return value if value else word
        if op == "+":
            return word if value else ""
        if value is None:
            missing.append(name)
            return ""
        return value

    return _VAR.sub(one, ref), missing


def _analyse(
    text: str, build_args: Mapping[str, str]
) -> tuple[list[tuple[_Instruction, ImageUse, str]], list[str]]:
    """Each external image use with its instruction and the raw token naming it; problems."""
    uses: list[tuple[_Instruction, ImageUse, str]] = []
    problems: list[str] = []
    args: dict[str, str] = {}
    stages: list[str] = []  # lower-case stage names, by index ("" when unnamed)
    seen_from = False
    for ins in _instructions(text):
        where = f"line {ins.first + 1}"
        kw = ins.keyword
        if kw not in INSTRUCTIONS:
            problems.append(f"{where}: unknown instruction {kw} (the engine's builder refuses it)")
            continue
        known, buildkit = FLAGS.get(kw, frozenset()), BUILDKIT_FLAGS.get(kw, frozenset())
        for name, _value, raw in ins.flags:
            if name in buildkit:
                problems.append(
                    f"{where}: {kw} {raw.split('=')[0]} needs BuildKit, which the engine's builder is not"
                )
            elif name not in known:
                problems.append(f"{where}: {kw} has no flag {raw.split('=')[0]}")
        if kw in ("RUN", "COPY", "ADD") and _HEREDOC.search(ins.args):
            problems.append(
                f"{where}: {kw} with a heredoc (<<) needs BuildKit, which the engine's builder is not"
            )
        if kw == "ARG" and not seen_from:
            for decl in ins.args.split():
                name, eq, value = decl.partition("=")
                given = build_args.get(name)
                args[name] = given if given is not None else value.strip("\"'") if eq else args.get(name, "")
        elif kw == "FROM":
            seen_from = True
            words = ins.args.split()
            if not words:
                problems.append(f"{where}: FROM names no image")
                continue
            raw = words[0]
            stage = words[2].lower() if len(words) >= 3 and words[1].upper() == "AS" else ""
            ref, missing = _substitute(raw, {k: v for k, v in args.items() if v != ""})
            if missing:
                problems.append(
                    f"{where}: FROM {raw}: ARG {', '.join(missing)} has no value (no default, no build argument)"
                )
            elif ref.lower() not in stages and ref != "scratch":
                uses.append((ins, ImageUse(ref, ins.first + 1, "FROM"), raw))
            stages.append(stage)
        elif kw == "COPY":
            for flag, source, _ in ins.flags:
                if flag != "from" or not source or source.isdigit() or source.lower() in stages:
                    continue
                uses.append((ins, ImageUse(source, ins.first + 1, "COPY --from"), source))
    return uses, problems


def parse(text: str, build_args: Mapping[str, str] | None = None) -> DockerfileFacts:
    uses, problems = _analyse(text, build_args or {})
    return DockerfileFacts(images=tuple(u for _, u, _ in uses), problems=tuple(problems))


def rewrite(text: str, names: Mapping[str, str], build_args: Mapping[str, str] | None = None) -> str:
    """`text` with every external image use whose ref is a key of `names` renamed to its
    value, in place (the token on its physical line); everything else unchanged."""
    lines = text.splitlines(keepends=True)
    for ins, use, raw in _analyse(text, build_args or {})[0]:
        new = names.get(use.ref)
        if new is None:
            continue
        old_token = raw if use.kind == "FROM" else f"--from={raw}"
        new_token = new if use.kind == "FROM" else f"--from={new}"
        pattern = re.compile(r"(?<!\S)" + re.escape(old_token) + r"(?!\S)", re.IGNORECASE)
        for n in range(ins.first, ins.last + 1):
            lines[n], count = pattern.subn(new_token.replace("\\", "\\\\"), lines[n], count=1)
            if count:
                break
    return "".join(lines)
