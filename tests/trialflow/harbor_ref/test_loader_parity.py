"""Loader parity with Harbor itself (marker harbor_ref): every task.toml in corpus/ is read
by trialflow's loader and by Harbor 0.25's `TaskConfig` inside the reference container
(`trialflow-harbor-ref:0.25`, made by infra/base_image.py), and the results must agree:

- Harbor accepts -> trialflow resolves exactly the same values (`harbor_view`, Harbor's
  `model_dump(mode="json")` shape), and either runs the task or refuses it naming the
  feature the corpus file's `# expect: refused: <name>` line gives;
- Harbor rejects -> trialflow rejects it too (`TaskInvalid`), or refuses the feature
  anyway (MCP servers: Harbor's header rules are not repeated here).
Each corpus file's first line states the expectation, so a corpus file cannot silently
change meaning. The same container resolves `${VAR}` / `${VAR:-default}` env templates,
and, for the task directories in VERIFIER_TASKS, where a separate verifier runs (its
effective environment, the image's build context, whether the image brings /tests):
trialflow's `Task.separate_verifier` must say the same; for NETWORK_TASKS each phase's
network as Harbor's trial resolves it (`resolve_trial_network_plan`).
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
from pydantic import ValidationError

from trialflow.errors import TaskEnvMissing, TaskInvalid
from trialflow.task_config import TaskConfig, harbor_view
from trialflow.tasks import load_task, resolve_env, step_verifier_mode, unsupported_features

pytestmark = [pytest.mark.harbor_ref, pytest.mark.docker]

HERE = Path(__file__).resolve().parent
CORPUS = HERE / "corpus"
FILES = sorted(p.name for p in CORPUS.glob("*.toml"))
ENV_CASES = [
    {"host": {"A": "1"}, "env": {"K": "${A}"}},
    {"host": {"A": ""}, "env": {"K": "${A}"}},
    {"host": {}, "env": {"K": "${A:-dflt}"}},
    {"host": {"A": ""}, "env": {"K": "${A:-dflt}"}},
    {"host": {"A": "1"}, "env": {"K": "pre-${A}", "L": "$A", "M": "${A}-post"}},
    {"host": {}, "env": {"K": "${A:-}"}},
    {"host": {}, "env": {"K": "${A}"}},
    {"host": {"A B": "x"}, "env": {"K": "${A B}"}},
]


# Separate verifier environments: task.toml, and whether tests/ holds a Dockerfile.
_SEPARATE = '[verifier]\nenvironment_mode = "separate"\n'
VERIFIER_TASKS: dict[str, tuple[str, bool]] = {
    "shared": ("", False),
    "separate-agent-image": (_SEPARATE + '[environment]\nworkdir = "/app"\ncpus = 2\n', False),
    "separate-tests-dockerfile": (_SEPARATE + '[environment]\nworkdir = "/app"\n', True),
    "env-implies-separate": ("[verifier.environment]\nmemory_mb = 256\n", True),
    "env-without-dockerfile": (
        '[verifier.environment]\nworkdir = "/g"\n[environment]\ndocker_image = "a:1"\n',
        False,
    ),
    "env-docker-image": ('[verifier.environment]\ndocker_image = "grader:2"\n', True),
    "separate-task-docker-image": (_SEPARATE + '[environment]\ndocker_image = "agent:3"\n', False),
}


def _write_verifier_tasks(root: Path) -> Path:
    for name, (toml, dockerfile) in VERIFIER_TASKS.items():
        for rel, text in {
            "task.toml": toml,
            "instruction.md": "Do it.\n",
            "environment/Dockerfile": "FROM trialflow-base:bookworm\n",
            "tests/test.sh": "echo 1 > /logs/verifier/reward.txt\n",
            **({"tests/Dockerfile": "FROM trialflow-base:bookworm\nCOPY . /tests/\n"} if dockerfile else {}),
        }.items():
            (root / name / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / name / rel).write_text(text)
    return root


# Multi-step task directories: files (path -> text); every one has environment/Dockerfile.
_STEP_TOML = '[[steps]]\nname = "plan"\n[[steps]]\nname = "build it"\n'
_OK = "echo 1 > /logs/verifier/reward.txt\n"
STEP_TASKS: dict[str, dict[str, str]] = {
    "shared-tests-and-own": {
        "task.toml": _STEP_TOML,
        "tests/test.sh": _OK,
        "steps/plan/instruction.md": "<!-- canary GUID 1234 -->\n\nPlan it.\n",
        "steps/build it/instruction.md": "Build it.\n",
        "steps/build it/tests/test.sh": _OK,
        "steps/build it/solution/solve.sh": "true\n",
    },
    "own-tests-only": {
        "task.toml": _STEP_TOML + 'multi_step_reward_strategy = "final"\n',
        "instruction.md": "ignored for a multi-step task\n",
        "steps/plan/instruction.md": "Plan.\n",
        "steps/plan/tests/test.sh": _OK,
        "steps/build it/instruction.md": "Build.\n",
        "steps/build it/tests/test.sh": _OK,
        "steps/build it/tests/data.txt": "x\n",
    },
    "step-tests-without-script": {  # steps/plan/tests/ has no test.sh: the shared one runs
        "task.toml": _STEP_TOML,
        "tests/test.sh": _OK,
        "steps/plan/instruction.md": "Plan.\n",
        "steps/plan/tests/helper.py": "\n",
        "steps/build it/instruction.md": "Build.\n",
        "steps/build it/solution/notes.txt": "no solve.sh: loads; the oracle cannot run it\n",
    },
    # Separate verifier environments per step (Harbor's per-step image precedence).
    "separate-per-step": {  # "build it" only, in an image built from its own tests/
        "task.toml": _STEP_TOML + '[steps.verifier]\nenvironment_mode = "separate"\n',
        "tests/test.sh": _OK,
        "tests/Dockerfile": "FROM trialflow-base:bookworm\n",  # the shared tests/: not this step's
        "steps/plan/instruction.md": "Plan.\n",
        "steps/build it/instruction.md": "Build.\n",
        "steps/build it/tests/Dockerfile": "FROM trialflow-base:bookworm\nCOPY . /tests/\n",
    },
    "inherited-separate": {  # [verifier] separate for both; "plan" names its own prebuilt image
        "task.toml": '[verifier]\nenvironment_mode = "separate"\n[verifier.environment]\ncpus = 2\n'
        + '[[steps]]\nname = "plan"\n[steps.verifier.environment]\ndocker_image = "grader:1"\n'
        + 'memory_mb = 512\n[[steps]]\nname = "build it"\n',
        "tests/test.sh": _OK,
        "tests/Dockerfile": "FROM trialflow-base:bookworm\nCOPY . /tests/\n",
        "steps/plan/instruction.md": "Plan.\n",
        "steps/build it/instruction.md": "Build.\n",
    },
    "separate-on-agent-image": {  # no verifier image anywhere: the agent's, tests uploaded
        "task.toml": '[environment]\nworkdir = "/app"\n'
        + _STEP_TOML.replace(
            'name = "plan"\n', 'name = "plan"\n[steps.verifier.environment]\nworkdir = "/g"\n'
        ),
        "tests/test.sh": _OK,
        "steps/plan/instruction.md": "Plan.\n",
        "steps/build it/instruction.md": "Build.\n",
    },
    "missing-step-dir": {"task.toml": _STEP_TOML, "tests/test.sh": _OK, "steps/plan/instruction.md": "P\n"},
    "missing-step-instruction": {
        "task.toml": _STEP_TOML,
        "tests/test.sh": _OK,
        "steps/plan/instruction.md": "P\n",
        "steps/build it/tests/test.sh": _OK,
    },
    "no-test-for-a-step": {
        "task.toml": _STEP_TOML,
        "steps/plan/instruction.md": "P\n",
        "steps/plan/tests/test.sh": _OK,
        "steps/build it/instruction.md": "B\n",
    },
}


def _write_step_tasks(root: Path) -> Path:
    for name, files in STEP_TASKS.items():
        for rel, text in {"environment/Dockerfile": "FROM trialflow-base:bookworm\n", **files}.items():
            (root / name / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / name / rel).write_text(text)
    return root


# Each phase's network (trialflow.sandbox.network.resolve_network vs Harbor's
# resolve_trial_network_plan): task.toml of each task; every one gets the same other files.
_NET_STEPS = '[[steps]]\nname = "one"\n[steps.agent]\nnetwork_mode = "public"\n[steps.verifier]\n'
NETWORK_TASKS: dict[str, str] = {
    "silent": "",
    "environment-no-network": '[environment]\nnetwork_mode = "no-network"\n',
    "environment-allowlist": '[environment]\nnetwork_mode = "allowlist"\nallowed_hosts = ["a.org", "*.b.org"]\n',
    "legacy-allow-internet-false": "[environment]\nallow_internet = false\n",
    "legacy-allow-internet-true": "[environment]\nallow_internet = true\n",
    # The shared verifier's baseline is the environment's, not the agent phase's override.
    "agent-override-only": '[agent]\nnetwork_mode = "no-network"\n',
    "agent-allowlist": '[agent]\nnetwork_mode = "allowlist"\nallowed_hosts = ["10.0.0.0/8"]\n',
    "verifier-override-only": '[verifier]\nnetwork_mode = "allowlist"\nallowed_hosts = ["pypi.org"]\n',
    "both-overrides": '[environment]\nnetwork_mode = "public"\n[agent]\nnetwork_mode = "no-network"\n'
    + '[verifier]\nnetwork_mode = "no-network"\n',
    # Separate verifiers: their own environment's baseline, or the copied [environment]'s.
    "separate-own-environment": '[environment]\nnetwork_mode = "no-network"\n[verifier.environment]\n'
    + "memory_mb = 256\n",
    "separate-own-network": '[verifier.environment]\nnetwork_mode = "no-network"\n',
    "separate-inherits": '[verifier]\nenvironment_mode = "separate"\n[environment]\nnetwork_mode = "allowlist"\n'
    + 'allowed_hosts = ["c.org"]\n',
    # Steps: a step's phase override first, then the task's, then the environment's.
    "steps": '[environment]\nnetwork_mode = "no-network"\n[verifier]\nnetwork_mode = "allowlist"\n'
    + 'allowed_hosts = ["d.org"]\n'
    + _NET_STEPS
    + 'network_mode = "public"\n[[steps]]\nname = "two"\n',
    "steps-silent": _NET_STEPS + '[[steps]]\nname = "two"\n[steps.verifier]\nnetwork_mode = "no-network"\n',
}


# A run's extra hosts (Harbor's --allow-agent-host / --allow-verifier-host), as both normalise them.
EXTRA_HOSTS = {"agent": ["Extra.ORG.", "a.org"], "verifier": ["10.0.0.0/8", "*.Pkg.dev"]}


def _write_network_tasks(root: Path) -> Path:
    for name, toml in NETWORK_TASKS.items():
        files = {
            "task.toml": toml,
            "environment/Dockerfile": "FROM trialflow-base:bookworm\n",
            "tests/test.sh": _OK,
        }
        if "[[steps]]" in toml:
            files |= {"steps/one/instruction.md": "One.\n", "steps/two/instruction.md": "Two.\n"}
        else:
            files["instruction.md"] = "Do it.\n"
        for rel, text in files.items():
            (root / name / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / name / rel).write_text(text)
    return root


@pytest.fixture(scope="module")
def harbor(docker_client, tmp_path_factory) -> dict:
    from trialflow.sandbox.base_image import HARBOR_REF_IMAGE, ensure_harbor_ref_image

    ensure_harbor_ref_image(docker_client)
    tasks = _write_verifier_tasks(tmp_path_factory.mktemp("verifier-tasks"))
    step_tasks = _write_step_tasks(tmp_path_factory.mktemp("step-tasks"))
    net_tasks = _write_network_tasks(tmp_path_factory.mktemp("network-tasks"))
    out = docker_client.containers.run(
        HARBOR_REF_IMAGE,
        ["python", "/ref/harbor_dump.py", json.dumps(ENV_CASES)],
        network_mode="none",
        volumes={
            str(CORPUS): {"bind": "/corpus", "mode": "ro"},
            str(HERE): {"bind": "/ref", "mode": "ro"},
            str(tasks): {"bind": "/tasks", "mode": "ro"},
            str(step_tasks): {"bind": "/steptasks", "mode": "ro"},
            str(net_tasks): {"bind": "/nettasks", "mode": "ro"},
        },
        remove=True,
        stderr=False,
        environment={"TF_EXTRA_HOSTS": json.dumps(EXTRA_HOSTS)},
    )
    return {**json.loads(out), "tasks_dir": tasks, "step_tasks_dir": step_tasks, "net_tasks_dir": net_tasks}


def _expectation(name: str) -> tuple[str, str | None]:
    first = (CORPUS / name).read_text().splitlines()[0]
    assert first.startswith("# expect: "), f"{name}: first line must state the expectation"
    kind, _, rest = first.removeprefix("# expect: ").partition(":")
    feature = rest.split("(")[0].strip() or None
    return kind.split("(")[0].strip(), feature


def test_corpus_covers_every_harbor_field():
    """Every field of Harbor's current TaskConfig appears in some corpus file."""
    text = "\n".join((CORPUS / f).read_text() for f in FILES)
    fields = [
        "schema_version", "version", "[task]", "[metadata]", "source", "environment_mode",
        "[verifier.environment]", "verifier.collect", "[solution]", "build_timeout_sec",
        "docker_image", "os =", "cpus", "memory_mb", "memory =", "storage_mb", "storage =",
        "gpus", "gpu_types", "tpu", "allow_internet", "network_mode", "allowed_hosts",
        "${", "healthcheck", "workdir", "mcp_servers", "skills_dir", "[[steps]]", "min_reward",
        "artifacts", "multi_step_reward_strategy", "exclude", "destination", "service",
    ]  # fmt: skip
    assert [f for f in fields if f not in text] == []


@pytest.mark.parametrize("name", FILES)
def test_loader_agrees_with_harbor(harbor, name):
    kind, feature = _expectation(name)
    ref = harbor["configs"][name]
    raw = tomllib.loads((CORPUS / name).read_text())
    try:
        ours = TaskConfig.model_validate(raw)
    except ValidationError as e:
        assert "error" in ref, f"Harbor accepts {name} but trialflow rejects it: {e}"
        assert kind == "invalid", f"{name}: both reject it, but the corpus expects {kind}"
        return
    refused = unsupported_features(ours)
    if "error" in ref:
        # Harbor rejects what trialflow refuses anyway (e.g. details of MCP headers).
        assert kind == "refused" and feature and any(feature in r for r in refused), (
            f"trialflow accepts {name} but Harbor rejects it: {ref['error']}"
        )
        return
    assert harbor_view(ours) == ref["ok"]
    if kind == "ok":
        assert refused == []
    else:
        assert kind == "refused" and feature, f"{name}: Harbor accepts it; the corpus expects {kind}"
        assert any(feature in r for r in refused), (feature, refused)


def test_env_templates_resolve_as_harbor(harbor):
    for case, ref in zip(ENV_CASES, harbor["env"], strict=True):
        try:
            ours = {"ok": resolve_env(case["env"], case["host"])}
        except TaskEnvMissing as e:
            ours = {"error": str(e)}
        if "error" in ref:
            assert "error" in ours, (case, ref)
        else:
            assert ours == ref, case


@pytest.mark.parametrize("name", sorted(VERIFIER_TASKS))
def test_separate_verifier_environment_resolves_as_harbor(harbor, name):
    """Where the verifier runs: Harbor's `resolve_verifier_environment_definition`."""
    ref = harbor["verifier_envs"][name]
    ours = load_task(harbor["tasks_dir"] / name).separate_verifier
    if ref is None:
        assert ours is None
        return
    assert ours is not None
    assert harbor_view(ours.config) == ref["config"]
    assert ours.image.context_dir.name == ref["directory"]
    assert ours.bundled_tests == ref["bundled_tests"]


@pytest.mark.parametrize("name", sorted(STEP_TASKS))
def test_multi_step_task_loads_as_harbor(harbor, name):
    """A multi-step task directory: accepted or rejected as Harbor's `Task` does, and per step
    the instruction, test script, solution dir, verifier mode and separate verifier
    environment (`resolve_verifier_environment_definition`) Harbor's trial would use."""
    ref = harbor["step_tasks"][name]
    root = harbor["step_tasks_dir"] / name
    try:
        task = load_task(root)
    except TaskInvalid as e:
        assert "error" in ref, f"Harbor loads {name} but trialflow rejects it: {e}"
        return
    assert "ok" in ref, f"trialflow loads {name} but Harbor rejects it: {ref['error']}"
    ours = []
    for step in task.steps:
        view = task.step_view(step.name)
        overlay = view.tests_overlay
        test = (
            overlay / "test.sh"
            if overlay is not None and (overlay / "test.sh").is_file()
            else view.tests_dir / "test.sh"
        )
        assert view.solution_dir is None or view.solution_dir.is_dir()
        ours.append(
            {
                "name": step.name,
                "instruction": view.instruction,
                "test": test.relative_to(root).as_posix(),
                "solution": (view.solution_dir or root / "solution").relative_to(root).as_posix(),
                "verifier_mode": step_verifier_mode(
                    task.config, (task.config.steps or [])[step.index - 1]
                ).value,
                "verifier_env": view.separate_verifier
                and {
                    "config": harbor_view(view.separate_verifier.config),
                    "directory": view.separate_verifier.image.context_dir.relative_to(root).as_posix(),
                    "bundled_tests": view.separate_verifier.bundled_tests,
                },
            }
        )
    assert {"instruction": task.instruction, "steps": ours} == ref["ok"]


@pytest.mark.parametrize("name", sorted(NETWORK_TASKS))
def test_phase_networks_resolve_as_harbor(harbor, name):
    """Each phase's network (per step of a multi-step task) as Harbor's trial resolves it,
    when the run's agent default is Harbor's (public), with and without a run's extra hosts;
    the training default (agent no-network) differs only where the task states no agent
    network."""
    from trialflow.sandbox.network import PhaseNetwork, resolve_network
    from trialflow.task_config import normalize_allowed_hosts

    task = load_task(harbor["net_tasks_dir"] / name)
    extra = {phase: tuple(normalize_allowed_hosts(hosts)) for phase, hosts in EXTRA_HOSTS.items()}
    for run, plans in harbor["networks"][name].items():
        for step, ref in plans.items():
            view = task.step_view(step) if step else task
            for phase in ("agent", "verifier"):
                hosts = extra[phase] if run == "extra" else ()
                policy, origin = resolve_network(view, phase, PhaseNetwork("public", extra_hosts=hosts))
                assert [policy.mode, list(policy.allowed_hosts)] == ref[phase], (run, step, phase)
                if run == "plain":
                    training, _ = resolve_network(view, phase)
                    if phase == "verifier" or origin == "task":
                        assert training == policy, (step, phase)
                    else:
                        assert training.mode == "no-network", (step, phase)
