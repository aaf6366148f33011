"""Terminus-2's text protocol, as Harbor 0.25 defines it (pure: no I/O).

The facts below were read from Harbor 0.25's ``agents/terminus_2`` (its json-plain parser,
prompt templates and agent loop) so that our `terminus` scaffold's prompts, replies and
stopping rules are Harbor's and results compare. Harbor's prompt texts are formats the model
is trained/evaluated on, so they are reproduced exactly (`PROMPT_TEMPLATE`, `TIMEOUT_TEMPLATE`,
the confirmation and error messages).

Reply parsing (`parse_response` -> `ParseResult(commands, task_complete, error, warning,
analysis, plan)`):
- the JSON object is the first balanced top-level ``{...}`` (braces in strings skipped; a
  backslash escapes the next character everywhere, as Harbor's scanner does); none: error
  "No valid JSON object found"; text before/after it: warnings.
- not valid JSON: error ``Invalid JSON: ...`` with a content preview, unless one of Harbor's
  auto-fixes (append the missing closing braces; take the first brace-balanced snippet that
  decodes) gives a valid reply: then an AUTO-CORRECTED warning says so.
- fields ``analysis``, ``plan``, ``commands`` are required ("Missing required fields: ...");
  ``commands`` must be an array; non-string analysis/plan and a ``task_complete`` that is not
  a bool or string are warnings; a string ``task_complete`` is true for "true"/"1"/"yes".
- each command needs a string ``keystrokes``; ``duration`` missing or not a number: 1.0 with
  a warning; unknown fields and a missing trailing newline before a next command: warnings.
  A command error when ``task_complete`` is true is only a warning (complete, no commands).
Durations are capped at 60 s when executed (`MAX_DURATION_S`).

Loop messages: the first user message is `PROMPT_TEMPLATE` (no system message); a reply with
an error gets `error_prompt`; otherwise the commands run and the next message is the
terminal output (`limit_output_length`, 10000 bytes, head and tail kept), prefixed with the
warnings when there were any; the first ``task_complete`` gets `confirmation_message`, and a
second one in a row ends the run (complete). Terminal output is incremental
(`incremental_output`): "New Terminal Output:" with what the scrollback gained, else
"Current Terminal Screen:".
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

MAX_DURATION_S = 60.0
DEFAULT_DURATION_S = 1.0
MAX_OUTPUT_BYTES = 10000
REQUIRED_FIELDS = ("analysis", "plan", "commands")

PROMPT_TEMPLATE = """\
You are an AI assistant tasked with solving command-line tasks in a Linux environment. You will be given a task description and the output from previously executed commands. Your goal is to solve the task by providing batches of shell commands.

Format your response as JSON with the following structure:

{{
  "analysis": "Analyze the current state based on the terminal output provided. What do you see? What has been accomplished? What still needs to be done?",
  "plan": "Describe your plan for the next steps. What commands will you run and why? Be specific about what you expect each command to accomplish.",
  "commands": [
    {{
      "keystrokes": "ls -la\\n",
      "duration": 0.1
    }},
    {{
      "keystrokes": "cd project\\n",
      "duration": 0.1
    }}
  ],
  "task_complete": true
}}

Required fields:
- "analysis": Your analysis of the current situation
- "plan": Your plan for the next steps
- "commands": Array of command objects to execute

Optional fields:
- "task_complete": Boolean indicating if the task is complete (defaults to false if not present)

Command object structure:
- "keystrokes": String containing the exact keystrokes to send to the terminal (required)
- "duration": Number of seconds to wait for the command to complete before the next command will be executed (defaults to 1.0 if not present)

IMPORTANT: The text inside "keystrokes" will be used completely verbatim as keystrokes. Write commands exactly as you want them sent to the terminal:
- You must end every command with a newline (\\n) or it will not execute.
- For special key sequences, use tmux-style escape sequences:
  - C-c for Ctrl+C
  - C-d for Ctrl+D

The "duration" attribute specifies the number of seconds to wait for the command to complete (default: 1.0) before the next command will be executed. On immediate tasks (e.g., cd, ls, echo, cat) set a duration of 0.1 seconds. On commands (e.g., gcc, find, rustc) set a duration of 1.0 seconds. On slow commands (e.g., make, python3 [long running script], wget [file]) set an appropriate duration as you determine necessary.

It is better to set a smaller duration than a longer duration. It is always possible to wait again if the prior output has not finished, by running {{"keystrokes": "", "duration": 10.0}} on subsequent requests to wait longer. Never wait longer than 60 seconds; prefer to poll to see intermediate result status.

Important notes:
- Each command's keystrokes are sent exactly as written to the terminal
- Do not include extra whitespace before or after the keystrokes unless it's part of the intended command
- Extra text before or after the JSON will generate warnings but be tolerated
- The JSON must be valid - use proper escaping for quotes and special characters within strings
- Commands array can be empty if you want to wait without taking action

Task Description:
{instruction}

Current terminal state:
{terminal_state}
"""  # noqa: E501 - Harbor's text, line for line

TIMEOUT_TEMPLATE = """\
Previous command:
{command}

The previous command timed out after {timeout_sec} seconds

It is possible that the command is not yet finished executing. If that is the case, then do nothing. It is also possible that you have entered an interactive shell and should continue sending keystrokes as normal.

Here is the current state of the terminal:

{terminal_state}"""  # noqa: E501


@dataclass(frozen=True)
class Command:
    keystrokes: str
    duration: float


@dataclass(frozen=True)
class ParseResult:
    commands: tuple[Command, ...]
    task_complete: bool
    error: str  # "" when the reply can be acted on
    warning: str  # "- a\n- b" or ""
    analysis: str = ""
    plan: str = ""


def _warned(warnings: list[str]) -> str:
    return "- " + "\n- ".join(warnings) if warnings else ""


def extract_json_content(response: str) -> tuple[str, list[str]]:
    """(the first balanced top-level object's text or "", warnings)."""
    start = end = -1
    depth = 0
    in_string = escape = False
    for i, char in enumerate(response):
        if escape:
            escape = False
            continue
        if char == "\\":
            escape = True
            continue
        if char == '"':
            in_string = not in_string
            continue
        if not in_string:
            if char == "{":
                if depth == 0:
                    start = i
                depth += 1
            elif char == "}":
                depth -= 1
                if depth == 0 and start != -1:
                    end = i + 1
                    break
    if start == -1 or end == -1:
        return "", ["No valid JSON object found"]
    warnings = []
    if response[:start].strip():
        warnings.append("Extra text detected before JSON object")
    if response[end:].strip():
        warnings.append("Extra text detected after JSON object")
    return response[start:end], warnings


def parse_response(response: str) -> ParseResult:
    """See the module docstring. Never raises: problems are in `error` / `warning`."""
    result = _parse(response)
    if not result.error:
        return result
    for name, fix in _AUTO_FIXES:
        fixed_text = fix(response, result.error)
        if fixed_text is None:
            continue
        fixed = _parse(fixed_text)
        if not fixed.error:
            note = f"- AUTO-CORRECTED: {name} - please fix this in future responses"
            warning = f"{note}\n{fixed.warning}" if fixed.warning else note
            return ParseResult(fixed.commands, fixed.task_complete, "", warning, fixed.analysis, fixed.plan)
    return result


def _fix_incomplete_json(response: str, error: str) -> str | None:
    if any(k in error for k in ("Invalid JSON", "Expecting", "Unterminated", "No valid JSON found")):
        missing = response.count("{") - response.count("}")
        if missing > 0:
            return response + "}" * missing
    return None


_OBJECT = re.compile(r"\{[^{}]*(?:\{[^{}]*\}[^{}]*)*\}", re.DOTALL)


def _fix_mixed_content(response: str, error: str) -> str | None:
    for match in _OBJECT.findall(response):
        try:
            json.loads(match)
        except json.JSONDecodeError:
            continue
        return match
    return None


_AUTO_FIXES = (
    ("Fixed incomplete JSON by adding missing closing brace", _fix_incomplete_json),
    ("Extracted JSON from mixed content", _fix_mixed_content),
)


def _parse(response: str) -> ParseResult:
    content, warnings = extract_json_content(response)
    if not content:
        return ParseResult((), False, "No valid JSON found in response", _warned(warnings))
    try:
        data = json.loads(content)
    except json.JSONDecodeError as e:
        preview = repr(content) if len(content) < 200 else repr(content[:100]) + "..."
        label = "Content" if len(content) < 200 else "Content preview"
        return ParseResult((), False, f"Invalid JSON: {e} | {label}: {preview}", _warned(warnings))
    error = _validate(data, content, warnings)
    if error:
        return ParseResult((), False, error, _warned(warnings))
    complete: Any = data.get("task_complete", False)
    if isinstance(complete, str):
        complete = complete.lower() in ("true", "1", "yes")
    analysis, plan = data.get("analysis", ""), data.get("plan", "")
    commands, command_error = _commands(data.get("commands", []), warnings)
    if command_error:
        if complete:
            warnings.append(command_error)
            return ParseResult((), True, "", _warned(warnings), analysis, plan)
        return ParseResult((), False, command_error, _warned(warnings), analysis, plan)
    return ParseResult(tuple(commands), bool(complete), "", _warned(warnings), analysis, plan)


def _validate(data: Any, content: str, warnings: list[str]) -> str:
    if not isinstance(data, dict):
        return "Response must be a JSON object"
    missing = [f for f in REQUIRED_FIELDS if f not in data]
    if missing:
        return f"Missing required fields: {', '.join(missing)}"
    for name in ("analysis", "plan"):
        if not isinstance(data.get(name, ""), str):
            warnings.append(f"Field '{name}' should be a string")
    if not isinstance(data.get("commands", []), list):
        return "Field 'commands' must be an array"
    # order as the fields first appear in the text ("name": anywhere, as Harbor searches)
    positions = {f: m.start() for f in REQUIRED_FIELDS if (m := re.search(f'"({f})"\\s*:', content))}
    if len(positions) >= 2:
        actual = sorted(positions, key=positions.__getitem__)
        expected = [f for f in REQUIRED_FIELDS if f in positions]
        if actual != expected:
            warnings.append(
                f"Fields appear in wrong order. Found: {' → '.join(actual)}, expected: {' → '.join(expected)}"
            )
    task_complete = data.get("task_complete")
    if task_complete is not None and not isinstance(task_complete, (bool, str)):
        warnings.append("Field 'task_complete' should be a boolean or string")
    return ""


def _commands(raw: list[Any], warnings: list[str]) -> tuple[list[Command], str]:
    out = []
    for i, item in enumerate(raw):
        n = i + 1
        if not isinstance(item, dict):
            return [], f"Command {n} must be an object"
        if "keystrokes" not in item:
            return [], f"Command {n} missing required 'keystrokes' field"
        keystrokes = item["keystrokes"]
        if not isinstance(keystrokes, str):
            return [], f"Command {n} 'keystrokes' must be a string"
        if "duration" in item:
            duration = item["duration"]
            if isinstance(duration, bool) or not isinstance(duration, (int, float)):
                warnings.append(f"Command {n}: Invalid duration value, using default 1.0")
                duration = DEFAULT_DURATION_S
        else:
            warnings.append(f"Command {n}: Missing duration field, using default 1.0")
            duration = DEFAULT_DURATION_S
        unknown = sorted(set(item) - {"keystrokes", "duration"})
        if unknown:
            warnings.append(f"Command {n}: Unknown fields: {', '.join(unknown)}")
        if i < len(raw) - 1 and keystrokes and not keystrokes.endswith("\n"):
            warnings.append(
                f"Command {n} should end with newline when followed by another command. Otherwise "
                "the two commands will be concatenated together on the same line."
            )
        out.append(Command(keystrokes, float(duration)))
    return out, ""


# -- messages -------------------------------------------------------------------------------


def limit_output_length(output: str, max_bytes: int = MAX_OUTPUT_BYTES) -> str:
    """`output` if it fits in `max_bytes` (UTF-8), else its first and last halves around a note."""
    data = output.encode("utf-8")
    if len(data) <= max_bytes:
        return output
    half = max_bytes // 2
    first = data[:half].decode("utf-8", errors="ignore")
    last = data[-half:].decode("utf-8", errors="ignore")
    omitted = len(data) - len(first.encode("utf-8")) - len(last.encode("utf-8"))
    return f"{first}\n[... output limited to {max_bytes} bytes; {omitted} interior bytes omitted ...]\n{last}"


def initial_prompt(instruction: str, terminal_state: str) -> str:
    return PROMPT_TEMPLATE.format(instruction=instruction, terminal_state=limit_output_length(terminal_state))


def error_prompt(result: ParseResult) -> str:
    feedback = f"ERROR: {result.error}" + (f"\nWARNINGS: {result.warning}" if result.warning else "")
    return (
        f"Previous response had parsing errors:\n{feedback}\n\n"
        "Please fix these issues and provide a proper JSON response."
    )


def observation(result: ParseResult, terminal_output: str) -> str:
    """The next user message after the commands ran (not for a first `task_complete`)."""
    output = limit_output_length(terminal_output)
    if result.warning:
        return f"Previous response had warnings:\nWARNINGS: {result.warning}\n\n{output}"
    return output


def confirmation_message(terminal_output: str) -> str:
    return (
        f"Current terminal state:\n{limit_output_length(terminal_output)}\n\n"
        "Are you sure you want to mark the task as complete? "
        "This will trigger your solution to be graded and you won't be able to "
        'make any further corrections. If so, include "task_complete": true '
        "in your JSON response again."
    )


def incremental_output(previous: str | None, current: str, visible: str) -> str:
    """Harbor's terminal observation from the scrollback before (`previous`, None on the first
    look) and now (`current`) and the visible screen: "New Terminal Output:" with what follows
    the previous scrollback's last line when that scrollback is still there and something
    came after it, else "Current Terminal Screen:". (Harbor cuts at the previous text's last
    newline measured inside the previous text; kept as is.)"""
    if previous is None:
        return f"Current Terminal Screen:\n{visible}"
    pb = previous.strip()
    if pb in current:
        idx = current.index(pb)
        if "\n" in pb:
            idx = pb.rfind("\n")
        new = current[idx:]
        if new.strip():
            return f"New Terminal Output:\n{new}"
    return f"Current Terminal Screen:\n{visible}"
