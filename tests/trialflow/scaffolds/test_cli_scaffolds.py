"""Claude Code, OpenCode and Codex for real, besides the shared suite (test_scaffold_contract):
the host-installed CLIs run in a Docker sandbox and
talk to the real proxy, which generates through the ScriptedVLLM test double (scripted
hermes tool calls through the tiny model's tokenizer). The task verifier grades the result."""

from __future__ import annotations

import shutil
from dataclasses import replace

import pytest

from proxy.trajectory import Trajectory
from tests.doubles.scripted_vllm import Reply
from tests.trialflow.conftest import EXAMPLES
from tests.trialflow.scaffolds.conftest import forwarded_urls, hermes_call, require_cli
from trialflow.errors import ScaffoldSetupFailed
from trialflow.scaffolds import ScaffoldContext, get_scaffold
from trialflow.scaffolds.claude_code import summarize_stream
from trialflow.scaffolds.codex import summarize_events as summarize_codex
from trialflow.scaffolds.opencode import summarize_events
from trialflow.storage import TrialKeys
from trialflow.tasks import load_task
from trialflow.verifier import run_verifier

pytestmark = [pytest.mark.docker, pytest.mark.scaffold_cli]

CREATE = "printf 'Hello, trialflow!\\n' > /app/hello.txt"


async def _context(sandbox_for, proxy, scaffold, *, timeout_s=180.0, mounts=True, task=None, **kw):
    task = task or load_task(EXAMPLES / "create-file")
    sandbox = await sandbox_for(task, mounts=scaffold.mounts() if mounts else ())
    handle = proxy.open_session()
    anthropic_url, openai_url = await forwarded_urls(proxy, handle, sandbox)
    beats: list[dict] = []
    ctx = ScaffoldContext(
        sandbox=sandbox,
        task=task,
        anthropic_base_url=anthropic_url,
        openai_base_url=openai_url,
        model="tiny",
        timeout_s=timeout_s,
        heartbeat=beats.append,
        **kw,
    )
    return task, handle, ctx, beats


async def test_claude_code_solves_create_file(sandbox_for, scripted_proxy, tmp_path):
    scaffold = get_scaffold("claude-code", max_turns=5)
    require_cli(scaffold)
    proxy, vllm = await scripted_proxy(
        [
            Reply(hermes_call("Bash", {"command": CREATE, "description": "Create hello.txt"})),
            Reply("I created /app/hello.txt."),
        ]
    )
    task, handle, ctx, _ = await _context(sandbox_for, proxy, scaffold, log_dir=tmp_path / "logs")

    result = await scaffold.run(ctx)

    assert result.exit_code == 0 and not result.timed_out, result.log
    summary = summarize_stream(result.stdout)
    assert summary.result_subtype == "success" and summary.result_text == "I created /app/hello.txt."
    assert summary.tool_uses == 1 and summary.bad_lines == 0
    assert (tmp_path / "logs" / "claude-code.stdout.txt").read_text() == result.stdout
    assert (tmp_path / "logs" / "claude-code.summary.json").exists()
    verdict = await run_verifier(ctx.sandbox, task)
    assert verdict.reward_valid and verdict.reward == 1.0, verdict.stdout
    trajectory = await proxy.close_session(handle.session_id)
    assert trajectory.counters.turns == 2 and trajectory.counters.tool_calls == 1
    assert len(vllm.main_requests) == 2


async def test_opencode_solves_create_file(sandbox_for, scripted_proxy, tmp_path):
    scaffold = get_scaffold("opencode")
    require_cli(scaffold)
    # OpenCode first asks the same model for a session title; that side call gets `default`.
    proxy, vllm = await scripted_proxy(
        [Reply(hermes_call("bash", {"command": CREATE, "description": "Create hello.txt"})), Reply("Done.")],
        default=Reply("Create hello file"),
    )
    vllm.match = lambda prompt: "title generator" not in prompt
    task, handle, ctx, _ = await _context(sandbox_for, proxy, scaffold, log_dir=tmp_path / "logs")

    result = await scaffold.run(ctx)

    assert result.exit_code == 0 and not result.timed_out, result.log
    summary = summarize_events(result.stdout)
    assert summary.tool_uses == 1 and summary.errors == () and summary.last_finish_reason == "stop"
    verdict = await run_verifier(ctx.sandbox, task)
    assert verdict.reward_valid and verdict.reward == 1.0, verdict.stdout
    trajectory = await proxy.close_session(handle.session_id)
    assert trajectory.counters.tool_calls == 1 and trajectory.counters.turns >= 2
    assert len(vllm.main_requests) == 2


async def test_codex_solves_create_file(sandbox_for, scripted_proxy, tmp_path):
    """Codex over the Responses API: its exec_command tool runs the scripted command in the
    sandbox, the second turn (history resent as input items) extends the first."""
    scaffold = get_scaffold("codex")
    require_cli(scaffold)
    proxy, vllm = await scripted_proxy(
        [Reply(hermes_call("exec_command", {"cmd": CREATE})), Reply("I created /app/hello.txt.")]
    )
    task, handle, ctx, _ = await _context(sandbox_for, proxy, scaffold, log_dir=tmp_path / "logs")

    result = await scaffold.run(ctx)

    assert result.exit_code == 0 and not result.timed_out, result.log
    summary = summarize_codex(result.stdout)
    assert summary.completed and not summary.failed and summary.commands == 1, result.stdout
    assert summary.last_message == "I created /app/hello.txt."
    verdict = await run_verifier(ctx.sandbox, task)
    assert verdict.reward_valid and verdict.reward == 1.0, verdict.stdout
    trajectory = await proxy.close_session(handle.session_id)
    assert trajectory.counters.turns == 2 and trajectory.counters.tool_calls == 1
    (seg,) = trajectory.segments  # the resent history extended the first turn's tokens
    assert seg.kind == "main" and len(vllm.main_requests) == 2
    assert "exec_command" in vllm.decode(vllm.requests[0]["prompt"])  # Codex's own tool list


async def test_codex_turn_refused_by_the_proxy_fails_its_turn(sandbox_for, scripted_proxy):
    """Codex's prompt does not fit the session's context: the proxy answers the Responses
    API's 400 `context_length_exceeded`, Codex ends its turn failed (exit 1), nothing is
    generated."""
    scaffold = get_scaffold("codex")
    require_cli(scaffold)
    proxy, vllm = await scripted_proxy([])
    proxy.defaults = replace(proxy.defaults, max_context_tokens=500)
    _, handle, ctx, _ = await _context(sandbox_for, proxy, scaffold, timeout_s=120)

    result = await scaffold.run(ctx)

    assert result.exit_code == 1 and not result.timed_out, result.log
    summary = summarize_codex(result.stdout)
    assert summary.failed and not summary.completed and summary.commands == 0
    assert result.detail, result.log
    assert vllm.requests == []
    trajectory = await proxy.close_session(handle.session_id)
    assert trajectory.counters.overlong >= 1 and trajectory.counters.turns == 0


async def test_claude_code_against_a_closed_session_ends_with_an_api_error(sandbox_for, scripted_proxy):
    scaffold = get_scaffold("claude-code", max_turns=3, max_retries=0)
    require_cli(scaffold)
    proxy, vllm = await scripted_proxy([])
    _, handle, ctx, _ = await _context(sandbox_for, proxy, scaffold, timeout_s=120)
    await proxy.close_session(handle.session_id)  # every request now answers 404

    result = await scaffold.run(ctx)

    assert result.exit_code != 0 and not result.timed_out, result.log
    summary = summarize_stream(result.stdout)
    assert summary.is_error is True and summary.tool_uses == 0
    assert vllm.requests == []


async def test_missing_mount_is_a_setup_failure(sandbox_for, scripted_proxy):
    scaffold = get_scaffold("claude-code")
    require_cli(scaffold)
    proxy, _ = await scripted_proxy([])
    _, _, ctx, _ = await _context(sandbox_for, proxy, scaffold, mounts=False)
    with pytest.raises(ScaffoldSetupFailed, match="not executable in sandbox"):
        await scaffold.run(ctx)


def test_missing_host_install_is_a_setup_failure(tmp_path):
    for name in ("claude-code", "opencode", "codex"):
        with pytest.raises(ScaffoldSetupFailed, match="run infra/setup.sh"):
            get_scaffold(name, install_dir=tmp_path).mounts()


async def test_claude_code_runs_as_the_tasks_agent_user(sandbox_for, scripted_proxy, tmp_path):
    scaffold = get_scaffold("claude-code", max_turns=3)
    require_cli(scaffold)
    task_dir = tmp_path / "as-nobody"
    shutil.copytree(EXAMPLES / "create-file", task_dir)
    toml = (task_dir / "task.toml").read_text().replace("[agent]\n", '[agent]\nuser = "nobody"\n', 1)
    (task_dir / "task.toml").write_text(toml)
    task = load_task(task_dir)
    assert task.config.agent.user == "nobody"
    proxy, _ = await scripted_proxy(
        [
            Reply(hermes_call("Bash", {"command": "id -un > /tmp/agent-user.txt", "description": "who"})),
            Reply("Done."),
        ]
    )
    sandbox = await sandbox_for(task, mounts=scaffold.mounts())
    handle = proxy.open_session()
    anthropic_url, _ = await forwarded_urls(proxy, handle, sandbox)
    ctx = ScaffoldContext(
        sandbox=sandbox, task=task, anthropic_base_url=anthropic_url, model="tiny", timeout_s=180
    )

    result = await scaffold.run(ctx)

    assert result.exit_code == 0, result.log
    who = await sandbox.exec(["cat", "/tmp/agent-user.txt"])
    assert who.stdout.strip() == "nobody"


@pytest.mark.parametrize(
    ("name", "skills_home"),
    [
        ("claude-code", "/tmp/trialflow-claude-home/.claude/skills"),
        ("codex", "/opt/trialflow-codex-home/.agents/skills"),
        ("opencode", "/tmp/trialflow-opencode-home/.config/opencode/skills"),
    ],
)
async def test_a_cli_reads_the_tasks_skills(
    name, skills_home, sandbox_for, scripted_proxy, tiny_model_dir, tmp_path
):
    """`[environment] skills_dir` (a directory in the sandbox's image) is copied where the CLI
    reads skills, as Harbor's installed agents copy it (Claude Code: ~/.claude/skills; Codex:
    ~/.agents/skills; OpenCode: ~/.config/opencode/skills): the CLI then offers the skill to
    the model in its first request."""
    from transformers import AutoTokenizer

    scaffold = get_scaffold(name, max_turns=2)
    require_cli(scaffold)
    task_dir = tmp_path / "with-skills"
    shutil.copytree(EXAMPLES / "create-file", task_dir)
    toml = (task_dir / "task.toml").read_text()
    (task_dir / "task.toml").write_text(
        toml.replace("[environment]\n", '[environment]\nskills_dir = "/opt/task-skills"\n')
    )
    skill = (
        "---\nname: trialflow-greeting\ndescription: Writes the trialflow greeting file when asked to greet.\n"
        "---\n\nWrite Hello, trialflow! to /app/hello.txt.\n"
    )
    (task_dir / "environment" / "skills" / "trialflow-greeting").mkdir(parents=True)
    (task_dir / "environment" / "skills" / "trialflow-greeting" / "SKILL.md").write_text(skill)
    dockerfile = task_dir / "environment" / "Dockerfile"
    dockerfile.write_text(dockerfile.read_text() + "COPY skills /opt/task-skills\n")
    proxy, vllm = await scripted_proxy([Reply("Done.")])
    _, handle, ctx, _ = await _context(sandbox_for, proxy, scaffold, task=load_task(task_dir))

    result = await scaffold.run(ctx)

    assert result.exit_code == 0, result.log
    copied = await ctx.sandbox.exec(["cat", f"{skills_home}/trialflow-greeting/SKILL.md"])
    assert copied.stdout == skill, copied
    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    # The agent's own request (with tools), not a side call such as OpenCode's title request.
    prompt = next(p for p in (tok.decode(r["prompt"]) for r in vllm.requests) if "title generator" not in p)
    assert "trialflow-greeting" in prompt and "Writes the trialflow greeting file" in prompt
    await proxy.close_session(handle.session_id)


MCP_SERVER = """
from mcp.server.fastmcp import FastMCP

mcp = FastMCP("mcp-tools", host="0.0.0.0", port=8000)


@mcp.tool()
def get_secret() -> str:
    \"\"\"Returns the secret value of the trialflow test.\"\"\"
    return "cookbook-mcp-secret-42"


mcp.run(transport="streamable-http")
"""


async def test_claude_code_gets_the_tasks_mcp_server_from_a_compose_service(
    sandbox_for, scripted_proxy, tiny_model_dir, tmp_path
):
    """The public mcp-tools shape, offline: an MCP server (the official `mcp` SDK, from the
    package index at build) in a compose service, `[[environment.mcp_servers]]` naming it at
    http://mcp-server:8000/mcp. Claude Code gets it through ~/.claude.json (as Harbor's agent
    writes it), reaches the service by name on the sandbox's loopback and offers its tool to
    the model in its first request."""
    from transformers import AutoTokenizer

    scaffold = get_scaffold("claude-code", max_turns=2)
    require_cli(scaffold)
    task_dir = tmp_path / "mcp-tools"
    shutil.copytree(EXAMPLES / "create-file", task_dir)
    toml = (task_dir / "task.toml").read_text()
    (task_dir / "task.toml").write_text(
        toml
        + '\n[[environment.mcp_servers]]\nname = "mcp-server"\ntransport = "streamable-http"\n'
        + 'url = "http://mcp-server:8000/mcp"\n'
    )
    env = task_dir / "environment"
    (env / "mcp-server").mkdir()
    (env / "mcp-server" / "server.py").write_text(MCP_SERVER)
    (env / "mcp-server" / "Dockerfile").write_text(
        'FROM python:3.12-slim\nRUN pip install -q "mcp>=1.10,<2"\nCOPY server.py /srv/server.py\n'
        'CMD ["python", "/srv/server.py"]\n'
    )
    (env / "docker-compose.yaml").write_text(
        "services:\n  main:\n    depends_on:\n      mcp-server: {condition: service_healthy}\n"
        "  mcp-server:\n    build: ./mcp-server\n    expose: ['8000']\n    healthcheck:\n"
        '      test: ["CMD", "python", "-c", "import socket; socket.create_connection((\'localhost\', 8000), 2)"]\n'
        "      interval: 1s\n      retries: 30\n"
    )
    proxy, vllm = await scripted_proxy([Reply("Done.")])
    _, handle, ctx, _ = await _context(sandbox_for, proxy, scaffold, task=load_task(task_dir))

    result = await scaffold.run(ctx)

    assert result.exit_code == 0, result.log
    config = await ctx.sandbox.exec(["cat", "/tmp/trialflow-claude-home/.claude.json"])
    assert '"url": "http://mcp-server:8000/mcp"' in config.stdout, config
    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    prompt = tok.decode(vllm.main_requests[0]["prompt"])
    assert "mcp__mcp-server__get_secret" in prompt and "secret value of the trialflow test" in prompt
    await proxy.close_session(handle.session_id)


@pytest.mark.parametrize("name", ["codex", "opencode"])
async def test_the_scaffold_activity_takes_max_turns_per_trial_and_heartbeats(
    name, backend, scripted_proxy, tmp_path
):
    """Production wiring, through the real scaffold activity (temporalio's ActivityEnvironment
    records its heartbeats): the trial's `scaffold_options` reach the CLI scaffold, whose
    `max_turns` becomes its proxy session's limit, and the run ends as "max_turns" with the
    refusal in the stored trajectory; the CLI's own `ScaffoldContext.heartbeat` details (its
    output lines) arrive as activity heartbeats."""
    from temporalio.testing import ActivityEnvironment

    from activities.scaffold import ScaffoldActivities
    from trialflow.metrics import TrialMetrics
    from trialflow.storage import LocalStore
    from workflows.shared import ScaffoldHeartbeat, ScaffoldInput

    busy = {
        "codex": Reply(hermes_call("exec_command", {"cmd": "sleep 6"})),
        "opencode": Reply(hermes_call("bash", {"command": "sleep 6", "description": "wait"})),
    }[name]
    scaffold = get_scaffold(name)
    require_cli(scaffold)
    proxy, vllm = await scripted_proxy([busy] * 3, default=Reply("A title"))
    if name == "opencode":
        vllm.match = lambda prompt: "title generator" not in prompt
    task = load_task(EXAMPLES / "create-file")
    sandbox = await backend.create(task, trial_id="test-activity", mounts=scaffold.mounts())
    store = LocalStore(tmp_path / "store")
    try:
        await sandbox.start()
        acts = ScaffoldActivities(proxy, backend, store, TrialMetrics(), default_model="tiny")
        env = ActivityEnvironment()
        beats: list = []
        env.on_heartbeat = lambda *details: beats.extend(details)  # empty: a liveness beat
        out = await env.run(
            acts.run_scaffold,
            ScaffoldInput(
                batch_id="b",
                trial_id="t-activity",
                attempt=1,
                sandbox_id=sandbox.id,
                task_path=str(EXAMPLES / "create-file"),
                scaffold=name,
                agent_timeout_s=150,
                scaffold_options={"max_turns": 1},
            ),
        )
    finally:
        await sandbox.stop()
    assert out.termination_reason == "max_turns" and out.error is None, out
    assert out.turns >= 1 and out.tool_calls == 1 and len(vllm.main_requests) == 1
    trajectory = Trajectory.from_bytes(store.get_bytes(TrialKeys("b", "t-activity", 1).trajectory))
    assert trajectory.counters.turn_limited >= 1
    from_cli = [b.scaffold for b in beats if isinstance(b, ScaffoldHeartbeat) and b.scaffold]
    assert from_cli and from_cli[-1]["scaffold"] == name and "output_lines" in from_cli[-1], beats


@pytest.mark.parametrize(
    ("name", "options"),
    [
        ("opencode", {"model_args": {"reasoningEffort": "none", "max_tokens": 99}}),
        ("codex", {"config": {"model_reasoning_effort": "none"}}),
    ],
)
async def test_model_arguments_reach_the_model_request(name, options, sandbox_for, scripted_proxy):
    """A trial's model arguments for the CLI arrive in its requests, where the proxy acts on
    them: reasoning effort "none" switches the template's thinking off (the tiny template then
    opens the answer with an empty think block), OpenCode's `max_tokens` bounds the turn."""
    scaffold = get_scaffold(name, **options)
    require_cli(scaffold)
    proxy, vllm = await scripted_proxy([Reply("Done.")], default=Reply("A title"))
    _, _, ctx, _ = await _context(sandbox_for, proxy, scaffold, timeout_s=120)

    result = await scaffold.run(ctx)

    assert result.exit_code == 0, result.log
    main = vllm.main_requests[0]
    assert vllm.decode(main["prompt"]).endswith("<think>\n\n</think>\n\n"), vllm.decode(main["prompt"])[-200:]
    if name == "opencode":
        assert all(r["max_tokens"] == 99 for r in vllm.requests)
