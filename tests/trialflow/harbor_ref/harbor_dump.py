"""Runs INSIDE the Harbor reference container (trialflow-harbor-ref:0.25, Python 3.13):
loads every /corpus/*.toml with Harbor's own TaskConfig, resolves env templates with
Harbor's own resolver and, for every task directory under /tasks (when mounted), where
Harbor would run a separate verifier (`resolve_verifier_environment_definition`), and for
every one under /nettasks each phase's network (`resolve_trial_network_plan`); prints one
JSON object to stdout. Not imported by trialflow."""

import json
import os
import sys
import warnings
from pathlib import Path

from harbor.models.task.config import TaskConfig
from harbor.models.task.paths import TaskPaths
from harbor.models.task.task import Task
from harbor.models.task.verifier_mode import (
    resolve_step_verifier_mode,
    resolve_task_verifier_mode,
    resolve_verifier_environment_definition,
)
from harbor.models.trial.config import AgentConfig, EnvironmentConfig, VerifierConfig
from harbor.trial.network_policy import resolve_trial_network_plan
from harbor.utils.env import resolve_env_vars

warnings.simplefilter("ignore")
# A run's extra hosts per phase (Harbor's --allow-agent-host / --allow-verifier-host); read
# before the env-template cases below replace the environment.
extra = json.loads(os.environ.get("TF_EXTRA_HOSTS") or '{"agent": [], "verifier": []}')
out = {"configs": {}, "env": [], "verifier_envs": {}, "step_tasks": {}, "networks": {}}
for path in sorted(Path("/corpus").glob("*.toml")):
    try:
        cfg = TaskConfig.model_validate_toml(path.read_text())
        out["configs"][path.name] = {"ok": cfg.model_dump(mode="json")}
    except Exception as e:  # a refusal is data here
        out["configs"][path.name] = {"error": f"{type(e).__name__}: {e}"}
for case in json.loads(sys.argv[1]):
    os.environ.clear()
    os.environ.update(case["host"])
    try:
        out["env"].append({"ok": resolve_env_vars(case["env"])})
    except Exception as e:
        out["env"].append({"error": f"{type(e).__name__}: {e}"})
for task in sorted(Path("/tasks").glob("*/")) if Path("/tasks").is_dir() else []:
    cfg = TaskConfig.model_validate_toml((task / "task.toml").read_text())
    found = resolve_verifier_environment_definition(cfg, TaskPaths(task))
    out["verifier_envs"][task.name] = found and {
        "config": found.config.model_dump(mode="json"),
        "directory": found.directory.name,
        "bundled_tests": found.bundled_tests,
    }


def _definition(cfg, paths, step, task_dir):
    """Where a step's separate verifier runs (None: shared), as the step tests compare it."""
    found = resolve_verifier_environment_definition(cfg, paths, step)
    return found and {
        "config": found.config.model_dump(mode="json"),
        "directory": found.directory.relative_to(task_dir).as_posix(),
        "bundled_tests": found.bundled_tests,
    }


for task_dir in sorted(Path("/steptasks").glob("*/")) if Path("/steptasks").is_dir() else []:
    # A multi-step task as Harbor loads it (`Task`), and per step what its trial runs: the
    # instruction, the test script (`Verifier._resolve_tests`: the step's, else the shared
    # one), the solution dir (`OracleAgent._resolve_solution_paths`) and the verifier mode.
    try:
        task = Task(task_dir)
    except Exception as e:
        out["step_tasks"][task_dir.name] = {"error": f"{type(e).__name__}: {e}"}
        continue
    steps = []
    for step in task.config.steps or []:
        os_ = task.config.environment.os
        test = task.paths.discovered_step_test_path_for(
            step.name, os_
        ) or task.paths.discovered_test_path_for(os_)
        solution = task.paths.step_solution_dir(step.name)
        steps.append(
            {
                "name": step.name,
                "instruction": task.step_instruction(step.name),
                "test": test.relative_to(task_dir).as_posix() if test else None,
                "solution": (solution if solution.exists() else task.paths.solution_dir)
                .relative_to(task_dir)
                .as_posix(),
                "verifier_mode": resolve_step_verifier_mode(task.config, step).value,
                "verifier_env": _definition(task.config, task.paths, step, task_dir),
            }
        )
    out["step_tasks"][task_dir.name] = {"ok": {"instruction": task.instruction, "steps": steps}}


def _policy(policy):
    return [policy.network_mode.value, list(policy.allowed_hosts)]


for task_dir in sorted(Path("/nettasks").glob("*/")) if Path("/nettasks").is_dir() else []:
    # Each phase's network as Harbor's trial resolves it (`resolve_trial_network_plan`), for a
    # run without extra hosts ("plain") and with TF_EXTRA_HOSTS ("extra"): per step for a
    # multi-step task, else one plan ("" key).
    cfg = TaskConfig.model_validate_toml((task_dir / "task.toml").read_text())
    runs = {
        "plain": (AgentConfig(), VerifierConfig()),
        "extra": (
            AgentConfig(extra_allowed_hosts=extra["agent"]),
            VerifierConfig(extra_allowed_hosts=extra["verifier"]),
        ),
    }
    plans = {}
    for run, (agent, verifier) in runs.items():
        for step in cfg.steps or [None]:
            mode = resolve_step_verifier_mode(cfg, step) if step else resolve_task_verifier_mode(cfg)
            plan = resolve_trial_network_plan(
                cfg, agent, EnvironmentConfig(), verifier, step, verifier_mode=mode
            )
            plans.setdefault(run, {})[step.name if step else ""] = {
                "agent": _policy(plan.agent_phase),
                "verifier": _policy(plan.verifier_phase),
            }
    out["networks"][task_dir.name] = plans
print(json.dumps(out))
