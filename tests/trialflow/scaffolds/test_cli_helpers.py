"""Pure parts of the CLI scaffolds: command lines, env, config, output folds, binary lookup."""

from __future__ import annotations

import json
import shlex

import pytest

from tests.trialflow.conftest import EXAMPLES
from trialflow.errors import ScaffoldSetupFailed
from trialflow.sandbox.base import Sandbox
from trialflow.scaffolds import ScaffoldContext, get_scaffold
from trialflow.scaffolds._cli import CliRun, cli_mount, find_binary
from trialflow.scaffolds.claude_code import (
    claude_argv,
    claude_env,
    stop_reason_of,
    summarize_stream,
)
from trialflow.scaffolds.codex import check_config, codex_argv, toml_value
from trialflow.scaffolds.opencode import opencode_config, opencode_env, summarize_events
from trialflow.tasks import load_task

# Shapes as Claude Code 2.1.197 printed them against a scripted endpoint (trimmed).
CLAUDE_STREAM = "\n".join(
    [
        json.dumps({"type": "system", "subtype": "init", "tools": ["Bash"]}),
        json.dumps(
            {
                "type": "assistant",
                "message": {
                    "content": [
                        {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "ls"}}
                    ]
                },
            }
        ),
        json.dumps(
            {"type": "user", "message": {"content": [{"type": "tool_result", "tool_use_id": "toolu_1"}]}}
        ),
        "this line is not JSON",
        json.dumps({"type": "assistant", "message": {"content": [{"type": "text", "text": "Done."}]}}),
        json.dumps(
            {"type": "result", "subtype": "success", "is_error": False, "num_turns": 2, "result": "Done."}
        ),
    ]
)

# Shapes as OpenCode 1.18.33 `run --format json` printed them (trimmed).
OPENCODE_EVENTS = "\n".join(
    [
        json.dumps({"type": "step_start", "part": {"type": "step-start"}}),
        json.dumps(
            {"type": "tool_use", "part": {"type": "tool", "tool": "bash", "state": {"status": "completed"}}}
        ),
        json.dumps({"type": "step_finish", "part": {"reason": "tool-calls"}}),
        json.dumps({"type": "text", "part": {"text": "Done."}}),
        json.dumps({"type": "step_finish", "part": {"reason": "stop"}}),
        "[1, 2]",
    ]
)


def test_summarize_claude_stream():
    s = summarize_stream(CLAUDE_STREAM)
    assert (s.events, s.assistant_messages, s.tool_uses, s.bad_lines) == (5, 2, 1, 1)
    assert (s.result_subtype, s.is_error, s.num_turns, s.result_text) == ("success", False, 2, "Done.")


def test_summarize_claude_stream_without_result():
    s = summarize_stream(CLAUDE_STREAM.rsplit("\n", 1)[0] + "\n")
    assert s.result_subtype is None and s.is_error is None and s.num_turns is None
    assert summarize_stream("") == summarize_stream("\n\n")


def test_claude_stop_reason_is_max_turns_only_for_its_result_subtype():
    limit = json.dumps({"type": "result", "subtype": "error_max_turns", "is_error": True, "num_turns": 2})
    assert stop_reason_of(summarize_stream(CLAUDE_STREAM.rsplit("\n", 1)[0] + "\n" + limit)) == "max_turns"
    assert stop_reason_of(summarize_stream(CLAUDE_STREAM)) is None
    crashed = json.dumps({"type": "result", "subtype": "error_during_execution", "is_error": True})
    assert stop_reason_of(summarize_stream(crashed)) is None
    assert stop_reason_of(summarize_stream("")) is None  # no result event: the CLI died


def test_claude_detail_is_the_error_result_text_only():
    from trialflow.scaffolds.claude_code import ClaudeCodeScaffold

    scaffold = ClaudeCodeScaffold()
    failed = json.dumps(
        {"type": "result", "subtype": "success", "is_error": True, "result": "API Error: too long"}
    )
    assert scaffold.detail(summarize_stream(failed)) == "API Error: too long"
    assert scaffold.detail(summarize_stream(CLAUDE_STREAM)) is None  # success: no detail
    assert scaffold.detail(summarize_stream("")) is None


def test_summarize_opencode_events():
    s = summarize_events(OPENCODE_EVENTS)
    assert (s.events, s.steps, s.tool_uses, s.errors, s.last_finish_reason, s.bad_lines) == (
        5,
        2,
        1,
        (),
        "stop",
        1,
    )
    err = json.dumps(
        {"type": "error", "error": {"name": "APIError", "data": {"message": "Cannot connect to API"}}}
    )
    assert summarize_events(err).errors == ("Cannot connect to API",)
    assert summarize_events(json.dumps({"type": "error", "error": "boom"})).errors == ("boom",)


def test_claude_argv_keeps_the_instruction_last_after_double_dash():
    argv = claude_argv("-rf is not a flag here", "tiny", 7, ["--tools", ""])
    assert argv[-2:] == ["--", "-rf is not a flag here"]
    assert argv[argv.index("--model") + 1] == "tiny" and argv[argv.index("--max-turns") + 1] == "7"
    assert {"-p", "--dangerously-skip-permissions", "--verbose"} <= set(argv)
    assert argv[argv.index("--output-format") + 1] == "stream-json"
    assert "--max-turns" not in claude_argv("x", "tiny", None)


def test_claude_env():
    env = claude_env("http://127.0.0.1:1/s/a/b", "tiny", max_retries=0, api_timeout_s=90)
    assert env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:1/s/a/b" and env["ANTHROPIC_API_KEY"]
    assert env["IS_SANDBOX"] == "1" and env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == "1"
    assert env["CLAUDE_CODE_MAX_RETRIES"] == "0" and env["API_TIMEOUT_MS"] == "90000"
    assert "API_TIMEOUT_MS" not in claude_env("u", "m", max_retries=2, api_timeout_s=None)


def test_opencode_config_and_env():
    cfg = opencode_config("http://h/s/a/b/v1", "tiny")
    provider = cfg["provider"]["trialflow"]
    assert (
        provider["npm"] == "@ai-sdk/openai-compatible"
        and provider["options"]["baseURL"] == "http://h/s/a/b/v1"
    )
    assert cfg["model"] == cfg["small_model"] == "trialflow/tiny"
    assert "limit" not in provider["models"]["tiny"]
    limited = opencode_config("u", "m", context_limit=2048, output_limit=256)
    assert limited["provider"]["trialflow"]["models"]["m"]["limit"] == {"context": 2048, "output": 256}
    env = opencode_env(cfg)
    assert json.loads(env["OPENCODE_CONFIG_CONTENT"]) == cfg and env["HOME"].startswith("/tmp/")


def test_cli_run_script_quotes_everything():
    run = CliRun(name="x", argv=["/opt/bin/x", "--", "it's $HOME; rm -rf /"], env={}, home="/tmp/h")
    script = run.script()
    assert shlex.quote("it's $HOME; rm -rf /") in script
    assert f"> {run.stdout_path} 2> {run.stderr_path}" in script and "< /dev/null" in script
    assert script.startswith("mkdir -p /tmp/h /logs/agent && exec ")


def test_find_binary(tmp_path):
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "tool").write_text("#!/bin/sh\n")
    assert find_binary(tmp_path, ["a/tool", "b/tool"], what="tool") == (tmp_path / "b" / "tool").resolve()
    with pytest.raises(ScaffoldSetupFailed, match=r"tool binary not found \(tried .*a/tool"):
        find_binary(tmp_path, ["a/tool"], what="tool")
    mount = cli_mount(tmp_path / "b" / "tool", "tool")
    assert mount.target == "/opt/trialflow/bin/tool" and mount.read_only


class _UntouchedSandbox(Sandbox):
    """A fake that fails the test if a scaffold touches the sandbox at all."""

    id = "untouched"

    async def start(self):
        raise AssertionError("sandbox used")

    async def exec(self, cmd, **kw):
        raise AssertionError("sandbox used")

    async def listen_loopback(self):
        raise AssertionError("sandbox used")

    async def stop_processes(self):
        raise AssertionError("sandbox used")

    async def upload(self, local_path, remote_dir):
        raise AssertionError("sandbox used")

    async def restart_for_verification(self):
        raise AssertionError("sandbox used")

    async def is_running(self):
        raise AssertionError("sandbox used")

    async def base_environment(self):
        raise AssertionError("sandbox used")

    async def download(self, remote_path, local_dir, *, allowance=None):
        raise AssertionError("sandbox used")

    async def stop(self):
        raise AssertionError("sandbox used")


@pytest.mark.parametrize(
    ("name", "needs"),
    [("claude-code", "anthropic_base_url"), ("opencode", "openai_base_url"), ("terminus", "openai_base_url")],
)
async def test_model_scaffolds_without_a_proxy_session_fail_setup_before_touching_the_sandbox(name, needs):
    scaffold = get_scaffold(name)
    assert scaffold.name == name and scaffold.needs_model is True
    task = load_task(EXAMPLES / "create-file")
    ctx = ScaffoldContext(sandbox=_UntouchedSandbox(), task=task, model="tiny")
    with pytest.raises(ScaffoldSetupFailed, match=needs):
        await scaffold.run(ctx)


def test_opencode_model_args_become_the_model_entrys_options():
    cfg = opencode_config("u", "m", model_args={"reasoningEffort": "none", "max_tokens": 99})
    assert cfg["provider"]["trialflow"]["models"]["m"]["options"] == {
        "reasoningEffort": "none",
        "max_tokens": 99,
    }
    assert "options" not in opencode_config("u", "m")["provider"]["trialflow"]["models"]["m"]


def test_codex_config_goes_in_as_toml_overrides_after_the_sessions_routing():
    argv = codex_argv(
        "do it", "http://h/v1", "m", config={"model_reasoning_effort": "none", "x.y": [1, True]}
    )
    overrides = [argv[i + 1] for i, a in enumerate(argv) if a == "-c"]
    assert overrides[:2] == ['model="m"', 'model_provider="trialflow"']
    assert overrides[2].startswith('model_providers.trialflow={"name" = "trialflow proxy", ')
    assert overrides[-2:] == ['model_reasoning_effort="none"', "x.y=[1, true]"]
    assert argv[-2:] == ["--", "do it"]
    assert toml_value({"a": {"b": 'q"uote'}}) == '{"a" = {"b" = "q\\"uote"}}'
    for bad in ({"model": "other"}, {"model_providers.x.base_url": "http://elsewhere"}, {"k": None}):
        with pytest.raises(ValueError):
            check_config(bad)
