"""The command line and environment test.sh runs with (pure).

test.sh is started by the harness toolchain's `env` (`trialflow.sandbox.toolchain`), never
by a shell from the image: `env -u NAME ... PATH=... NAME=VALUE ... /tests/test.sh`, so the
kernel reads its shebang (`#!/bin/bash` runs /bin/bash itself: a `bash` planted earlier on
PATH is not consulted). A script without a shebang runs under `/bin/bash` by absolute path
(the image's shell ran it before too).

Environment: what the engine holds for the sandbox (the image's and the task's env; nothing
inside the sandbox changes it) and HOME as the engine sets it for the user, minus the
variables that make a loader or an interpreter run code before test.sh's first line
(`UNSAFE`, `UNSAFE_PREFIXES`: LD_PRELOAD, BASH_ENV, ENV, exported bash functions ...), PATH
set to the image's value (or the standard one when the image has none), then
`[verifier].env` and the verifier phase's egress settings on top: the task author's choices,
applied as given.
"""

from __future__ import annotations

from collections.abc import Mapping

from trialflow.sandbox.toolchain import DEFAULT_PATH, tool

UNSAFE = frozenset(
    {
        "BASH_ENV",
        "ENV",
        "BASHOPTS",
        "SHELLOPTS",
        "PROMPT_COMMAND",
        "PS4",
        "IFS",
        "CDPATH",
        "GLOBIGNORE",
        "PYTHONSTARTUP",
        "PYTHONINSPECT",
        "PERL5OPT",
        "RUBYOPT",
        "NODE_OPTIONS",
        "GCONV_PATH",
        "HOSTALIASES",
        "LOCPATH",
    }
)
UNSAFE_PREFIXES = ("LD_", "BASH_FUNC_")
# Always unset, present or not: the loader's own (HOME is the only variable the engine adds).
ALWAYS_UNSET = ("LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT", "BASH_ENV", "ENV")


def unsafe(name: str) -> bool:
    return name in UNSAFE or name.startswith(UNSAFE_PREFIXES)


def verifier_command(
    script: str, has_shebang: bool, base_env: Mapping[str, str], extra_env: Mapping[str, str]
) -> list[str]:
    """argv that runs `script` (module docstring). `base_env`: `Sandbox.base_environment()`;
    `extra_env`: [verifier].env plus the egress settings (they win)."""
    unset = sorted({*ALWAYS_UNSET, *(name for name in base_env if unsafe(name))})
    values = {"PATH": base_env.get("PATH") or DEFAULT_PATH, **extra_env}
    argv = tool("env")
    for name in unset:
        if name not in extra_env:
            argv += ["-u", name]
    argv += [f"{k}={v}" for k, v in values.items()]
    return argv + ([script] if has_shebang else ["/bin/bash", script])
