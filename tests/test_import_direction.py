"""Dependencies point one way: proxy <- trialflow <- activities <- workflows <- worker_main / CLI.

Every import in the project's packages (module level, inside functions and under
TYPE_CHECKING alike) is parsed with `ast` and checked against the layer table below.
Two modules sit outside the plain chain, on purpose:
- `workflows.shared` is the contract module (input/output types, queue names, ids: pure,
  imports nothing of ours), so every layer above the proxy may use it;
- `infra` (embedded services for tests and the demo) sits beside activities: it may use
  the domain layer, and only the entry points use it.
The entry layer (`worker_main`, `trialflow.cli`: the CLI and the worker process it and
`worker_main` run, `trialflow.cli._worker`) may import anything; no other module of `trialflow`
is exempt.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("proxy", "trialflow", "activities", "workflows", "infra")
ENTRY = ("worker_main", "trialflow.cli")

# layer -> the layers its modules may import
ALLOWED: dict[str, set[str]] = {
    "proxy": {"proxy"},
    "contract": set(),
    "domain": {"proxy", "contract", "domain"},
    "infra": {"proxy", "contract", "domain", "infra"},
    "activities": {"proxy", "contract", "domain", "activities"},
    "workflows": {"proxy", "contract", "domain", "activities", "workflows"},
    "entry": {"proxy", "contract", "domain", "infra", "activities", "workflows", "entry"},
}


def _within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def layer_of(module: str) -> str | None:
    """The layer of a dotted module name; None for modules not ours (stdlib, third party)."""
    if any(_within(module, e) for e in ENTRY):
        return "entry"
    if _within(module, "workflows.shared"):
        return "contract"
    top = module.split(".")[0]
    return {
        "proxy": "proxy",
        "trialflow": "domain",
        "activities": "activities",
        "workflows": "workflows",
        "infra": "infra",
    }.get(top)


def imported_modules(source: str, module: str, is_package: bool = False) -> list[tuple[int, str]]:
    """(line, dotted name) of every import in `source`; relative imports resolved against
    `module` (a package's ``__init__`` when `is_package`). `from pkg import name` counts as
    `pkg.name` (name may be a submodule)."""
    package = module if is_package else module.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
    return found


def violations(module: str, source: str, is_package: bool = False) -> list[str]:
    own = layer_of(module)
    assert own is not None, module
    out = []
    for line, target in imported_modules(source, module, is_package):
        theirs = layer_of(target)
        if theirs is not None and theirs not in ALLOWED[own]:
            out.append(f"{module}:{line} ({own}) imports {target} ({theirs})")
    return out


def project_modules() -> list[tuple[str, Path, bool]]:
    """(dotted name, file, is a package) of every module of ours."""
    mods = [("worker_main", REPO / "worker_main.py", False)]
    for pkg in PACKAGES:
        for path in sorted((REPO / pkg).rglob("*.py")):
            rel = path.relative_to(REPO).with_suffix("")
            is_package = rel.name == "__init__"
            parts = rel.parts[:-1] if is_package else rel.parts
            mods.append((".".join(parts), path, is_package))
    return mods


def test_every_import_points_down_the_layers():
    problems = []
    for module, path, is_package in project_modules():
        problems += violations(module, path.read_text(), is_package)
    assert not problems, "imports against the layer order:\n" + "\n".join(problems)


def test_the_checker_sees_every_import_form():
    # A check that cannot fail proves nothing: each form of a back-edge is caught.
    assert violations("trialflow.storage", "import worker_main\n")
    assert violations("trialflow.verl.agent_loop", "def f():\n    from worker_main import open_store\n")
    assert violations("trialflow.sandbox.docker", "from infra.base_image import ensure_base_image\n")
    assert violations("trialflow.cli", "x = 1\n") == []  # the entry layer may import anything (nothing here)
    assert violations(
        "trialflow.batch",
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from activities.store import X\n",
    )
    assert violations("workflows.shared", "from trialflow.errors import TaskInvalid\n")
    assert violations("proxy.session", "from trialflow.storage import ResultStore\n")
    assert violations("activities.sandbox", "from workflows.trial import TrialWorkflow\n")
    relative = "from . import docker\nfrom ..cli import app\n"
    assert violations("trialflow.sandbox.reaper", relative) == [
        "trialflow.sandbox.reaper:2 (domain) imports trialflow.cli.app (entry)"
    ]
    assert violations("trialflow.sandbox", "from ..cli import _worker\n", is_package=True) == [
        "trialflow.sandbox:1 (domain) imports trialflow.cli._worker (entry)"
    ]
    # the worker process is no exception of its own: a module of the domain package named
    # like it is domain, and importing the workflows from there is a back-edge
    assert violations("trialflow.worker", "from workflows.trial import TrialWorkflow\n")
    assert len(project_modules()) > 50  # the walk found the tree
    assert not violations("activities.sandbox", "from workflows.shared import SetupInput\n")
    assert not violations("worker_main", "from workflows.trial import TrialWorkflow\n")


@pytest.mark.parametrize(
    ("module", "layer"),
    [
        ("proxy.server", "proxy"),
        ("workflows.shared", "contract"),
        ("workflows.trial", "workflows"),
        ("trialflow.cli._demo", "entry"),
        ("trialflow.cli._worker", "entry"),
        ("trialflow.worker", "domain"),
        ("trialflow.storage", "domain"),
        ("infra.services", "infra"),
        ("json", None),
    ],
)
def test_layer_of(module, layer):
    assert layer_of(module) == layer
