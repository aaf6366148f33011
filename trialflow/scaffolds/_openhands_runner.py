"""OpenHands' own agent loop, run by the `openhands` scaffold INSIDE the sandbox.

NOT imported by trialflow: `trialflow.scaffolds.openhands` mounts this file read-only into
the sandbox and starts it with the Python 3.13 of the mounted trixie root (through that
root's own dynamic loader, see the scaffold's docstring), so it imports only the standard
library and the OpenHands SDK (PyPI ``openhands-sdk`` / ``openhands-tools`` 1.58, which
bring litellm). argv[1] is the JSON config; argv[2] the venv's site-packages.

The agent is the SDK's `Agent` with its `TerminalTool` (the subprocess backend: a bash
session of the sandbox itself) and `FileEditorTool`, plus its default `finish` tool; the
model is ``openai/<model>`` at the proxy session's OpenAI base URL (Chat Completions,
native tool calls, no retries: a failed turn is the proxy's to report, a retry would
record the same turn twice). `max_iteration_per_run` is the scaffold's `max_turns`.

stdout: one JSON object per line, for each conversation event ({"event": kind, ...}) and a
last line {"op": "done", "status": ..., "error_code": ..., "error": ...}. Exit code: 0 the
agent finished (its `finish` tool or a final message), 1 its iteration limit
(MaxIterationsReached), 2 another ending (stuck, error event), 3 an exception in the loop
(e.g. the proxy refused or could not be reached).
"""

from __future__ import annotations

import json
import os
import site
import sys

PROTOCOL = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # stray prints (rich, litellm) go to stderr
sys.stdout = sys.stderr

site.addsitedir(sys.argv[2])
# The interpreter is set up; the tools' bash must see the sandbox's own Python, not ours.
for _var in ("PYTHONHOME", "PYTHONPATH"):
    os.environ.pop(_var, None)

from openhands.sdk import LLM, Agent, Conversation, Tool  # noqa: E402
from openhands.sdk.conversation.state import ConversationExecutionStatus  # noqa: E402
from openhands.tools.file_editor import FileEditorTool  # noqa: E402
from openhands.tools.terminal import TerminalTool  # noqa: E402


def _send(message: dict) -> None:
    PROTOCOL.write(json.dumps(message, default=str) + "\n")
    PROTOCOL.flush()


def _on_event(event) -> None:
    record = {"event": type(event).__name__}
    for key in ("code", "detail", "tool_name"):
        value = getattr(event, key, None)
        if value is not None:
            record[key] = str(value)[:2000]
    _send(record)


def main(config: dict) -> int:
    llm = LLM(
        model=f"openai/{config['model']}",
        base_url=config["base_url"],
        api_key="trialflow",
        num_retries=0,
        native_tool_calling=True,
        usage_id="agent",
        **config["model_args"],
    )
    agent = Agent(
        llm=llm,
        tools=[
            Tool(name=TerminalTool.name, params={"terminal_type": "subprocess"}),
            Tool(name=FileEditorTool.name),
        ],
    )
    errors: list[tuple[str, str]] = []

    def on_event(event) -> None:
        if type(event).__name__ == "ConversationErrorEvent":
            errors.append((str(getattr(event, "code", "")), str(getattr(event, "detail", ""))))
        _on_event(event)

    conversation = Conversation(
        agent=agent,
        workspace=os.getcwd(),  # the task's workdir (the sandbox exec's)
        callbacks=[on_event],
        max_iteration_per_run=config["max_turns"],
        visualizer=None,
    )
    try:
        conversation.send_message(config["instruction"])
        conversation.run()
    except Exception as err:  # noqa: BLE001 - reported to the scaffold, which decides
        code, detail = errors[-1] if errors else ("", "")
        _send(
            {
                "op": "done",
                "status": "exception",
                "error_code": code or type(err).__name__,
                "error": f"{type(err).__name__}: {err}"[:4000],
            }
        )
        return 3
    status = conversation.state.execution_status
    code, detail = errors[-1] if errors else (None, None)  # type: ignore[assignment]
    _send({"op": "done", "status": status.value, "error_code": code, "error": detail})
    if status == ConversationExecutionStatus.FINISHED:
        return 0
    return 1 if code == "MaxIterationsReached" else 2


if __name__ == "__main__":
    sys.exit(main(json.loads(sys.argv[1])))
