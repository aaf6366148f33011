"""mini-swe-agent's own agent loop, run by the `mini-swe-agent` scaffold in mini-swe-agent's venv.

NOT imported by trialflow: `trialflow.scaffolds.mini_swe_agent` starts this file as a script
with the venv's Python (``python _mini_swe_runner.py CONFIG_JSON``), so it imports only the
standard library and `minisweagent` (PyPI ``mini-swe-agent`` 2.4, which brings litellm).

The agent is mini-swe-agent's `DefaultAgent` with its `LitellmModel` (tool calls, its
``bash`` tool) and the agent templates of its ``mini.yaml`` config; the model is
``openai/<model>`` at the proxy session's OpenAI base URL. Only the environment is ours:
`BridgeEnvironment.execute` sends each command to the scaffold and waits for the result,
one JSON object per line (this process's stdin/stdout, nothing else is written to stdout):

    -> {"op": "exec", "command": str, "timeout": int}     <- {"output": str, "returncode": int,
                                                               "exception_info": str}
    -> {"op": "done", "exit_status": str, "n_calls": int, "submission": str, "error": str}

The submission rule is mini-swe-agent's (`LocalEnvironment._check_finished`: output whose
first line is COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT, exit code 0). Exit code: 0 Submitted,
1 LimitsExceeded (its step limit = the scaffold's max_turns), 2 any other ending of the
agent (RepeatedFormatError, ...), 3 an exception (e.g. the model could not be reached).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

PROTOCOL = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # stray prints (rich, litellm) go to stderr
sys.stdout = sys.stderr

import yaml  # noqa: E402
from minisweagent import package_dir  # noqa: E402
from minisweagent.agents.default import DefaultAgent  # noqa: E402
from minisweagent.environments.local import LocalEnvironment  # noqa: E402
from minisweagent.models.litellm_model import LitellmModel  # noqa: E402


def _send(message: dict[str, Any]) -> None:
    PROTOCOL.write(json.dumps(message) + "\n")
    PROTOCOL.flush()


class BridgeEnvironment(LocalEnvironment):
    """Commands run in the trial's sandbox, through the scaffold."""

    def __init__(self, *, template_vars: dict[str, Any], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._template_vars = template_vars

    def execute(self, action: dict, cwd: str = "", *, timeout: int | None = None) -> dict[str, Any]:
        _send({"op": "exec", "command": action.get("command", ""), "timeout": timeout or self.config.timeout})
        line = sys.stdin.readline()
        if not line:
            raise RuntimeError("the scaffold closed the command channel")
        output = json.loads(line)
        self._check_finished(output)
        return output

    def get_template_vars(self, **kwargs: Any) -> dict[str, Any]:
        return {**self.config.model_dump(), **self._template_vars, **kwargs}


def main(config: dict[str, Any]) -> int:
    agent_config = yaml.safe_load(Path(package_dir / "config" / "mini.yaml").read_text())["agent"]
    agent_config |= {"step_limit": config["max_turns"], "cost_limit": 0, "output_path": None}
    model = LitellmModel(
        model_name=f"openai/{config['model']}",
        model_kwargs={"api_base": config["base_url"], "api_key": "trialflow", **config["model_args"]},
        cost_tracking="ignore_errors",
    )
    env = BridgeEnvironment(timeout=config["command_timeout_s"], template_vars=config["template_vars"])
    agent = DefaultAgent(model, env, **agent_config)
    try:
        result = agent.run(config["instruction"])
    except Exception as err:  # noqa: BLE001 - reported to the scaffold, which decides
        _send({"op": "done", "exit_status": type(err).__name__, "n_calls": agent.n_calls, "error": str(err)})
        return 3
    status = str(result.get("exit_status"))
    _send(
        {
            "op": "done",
            "exit_status": status,
            "n_calls": agent.n_calls,
            "submission": result.get("submission", ""),
        }
    )
    return {"Submitted": 0, "LimitsExceeded": 1}.get(status, 2)


if __name__ == "__main__":
    sys.exit(main(json.loads(sys.argv[1])))
