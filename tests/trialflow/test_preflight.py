"""`trialflow run` checks everything before submitting and prints one line per problem."""

from __future__ import annotations

import shutil
from pathlib import Path

from typer.testing import CliRunner

from tests.trialflow.conftest import EXAMPLES
from trialflow.cli import app
from trialflow.preflight import check_run
from trialflow.storage import LocalStore


def _copy(tmp_path: Path, rel: str, src: str = "create-file") -> Path:
    dest = tmp_path / rel
    shutil.copytree(EXAMPLES / src, dest)
    return dest


def test_a_good_batch_has_no_problems(tmp_path):
    tasks = [EXAMPLES / "create-file", EXAMPLES / "fix-bug"]
    assert check_run(tasks, "oracle", samples=2, store=lambda: LocalStore(tmp_path / "store")) == []


def test_every_problem_one_line(tmp_path):
    no_solution = _copy(tmp_path, "no-solution")
    shutil.rmtree(no_solution / "solution")
    gpu = _copy(tmp_path, "gpu")
    (gpu / "task.toml").write_text((gpu / "task.toml").read_text() + "gpus = 1\n")
    a, b = _copy(tmp_path, "x/dup"), _copy(tmp_path, "y/dup")
    problems = check_run(
        [tmp_path / "missing", no_solution, gpu, a, a, b], "oracle", samples=0, store=None, host_gpus=0
    )
    text = "\n".join(problems)
    assert all("\n" not in p for p in problems)
    assert "--samples must be at least 1 (got 0)" in text
    assert "missing: no such task directory" in text
    assert "solution/solve.sh is missing" in text
    assert "[environment].gpus = 1: this host has no GPUs (the NVIDIA driver lists 0)" in text
    assert "given twice" in text
    assert len(problems) == 5


def test_oracle_needs_a_solution_for_every_step(tmp_path):
    steps = _copy(tmp_path, "steps", "log-pipeline")
    assert check_run([steps], "oracle", samples=1, store=None) == []
    shutil.rmtree(steps / "solution")  # "filter" has no solution/ of its own: none is left for it
    [problem] = check_run([steps], "oracle", samples=1, store=None)
    assert "step 'filter': neither steps/filter/solution/solve.sh nor solution/solve.sh" in problem
    assert check_run([steps], "nop", samples=1, store=None) == []
    (steps / "steps/count/solution/solve.sh").unlink()
    assert (
        "steps/count/solution/solve.sh is missing" in check_run([steps], "oracle", samples=1, store=None)[1]
    )


def test_unknown_scaffold_and_a_store_that_does_not_answer(tmp_path):
    (tmp_path / "ro").write_text("a file where the store dir should be")
    problems = check_run(
        [EXAMPLES / "create-file"], "no-such-agent", samples=1, store=lambda: LocalStore(tmp_path / "ro")
    )
    assert problems[0].startswith("--scaffold: unknown scaffold 'no-such-agent'")
    assert problems[1].startswith("result store does not answer")


def _run_nowhere(tmp_path, samples_flag: str):
    """`trialflow run` of a missing task with 0 samples under `samples_flag`, nothing to connect to."""
    return CliRunner().invoke(
        app,
        ["run", str(tmp_path / "nowhere"), samples_flag, "0", "--store-dir", str(tmp_path / "s"),
         "--temporal-address", "127.0.0.1:1"],
        catch_exceptions=False,
    )  # fmt: skip


def test_cli_run_refuses_before_submitting(tmp_path):
    """No Temporal runs here: the refusal comes before any connection is made."""
    result = _run_nowhere(tmp_path, "--samples")
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert lines[-1] == "nothing submitted (2 problems)"
    assert any("--samples must be at least 1" in line for line in lines)
    assert "Traceback" not in result.output


def test_a_model_driven_scaffold_needs_a_model_in_process(tmp_path, tiny_model_dir):
    """README's `run ... --scaffold claude-code --replica URL` without --model-dir: refused
    before a sandbox is built (was: ModelNotConfigured in the trial, an invalid reward)."""
    from trialflow.preflight import InProcessModel

    task = [EXAMPLES / "create-file"]
    store = lambda: LocalStore(tmp_path / "store")  # noqa: E731
    no_dir = check_run(
        task, "claude-code", samples=1, store=store, model=InProcessModel(None, ["http://x:8000"])
    )
    assert len(no_dir) == 1 and "--model-dir DIR" in no_dir[0]
    no_replica = check_run(
        task, "claude-code", samples=1, store=store, model=InProcessModel(tiny_model_dir, [])
    )
    assert len(no_replica) == 1 and "--replica URL" in no_replica[0]
    not_a_model = check_run(
        task, "codex", samples=1, store=store, model=InProcessModel(tmp_path, ["http://x"])
    )
    assert "not a model directory" in not_a_model[0]
    ready = InProcessModel(tiny_model_dir, ["http://x:8000"])
    assert check_run(task, "claude-code", samples=1, store=store, model=ready) == []
    # model-free scaffolds and external workers (their own settings decide) are not asked
    assert check_run(task, "oracle", samples=1, store=store, model=InProcessModel(None, [])) == []
    assert check_run(task, "claude-code", samples=1, store=store, model=None) == []


def test_cli_run_claude_code_without_model_dir_is_refused(tmp_path):
    result = CliRunner().invoke(
        app,
        ["run", str(EXAMPLES / "create-file"), "--scaffold", "claude-code", "--replica", "http://127.0.0.1:9",
         "--store-dir", str(tmp_path / "s"), "--temporal-address", "127.0.0.1:1"],
        catch_exceptions=False,
    )  # fmt: skip
    assert result.exit_code == 2, result.output
    assert "--model-dir DIR" in result.output and "Traceback" not in result.output


def test_cli_run_attempts_is_a_deprecated_name_of_samples(tmp_path):
    """`--attempts` meant samples per task (not a trial's attempts): it still works, warns, and
    is hidden from `run --help`, which shows `--samples`."""
    result = _run_nowhere(tmp_path, "--attempts")
    assert result.exit_code == 2
    assert "--attempts is deprecated: use --samples" in result.output
    assert "--samples must be at least 1 (got 0)" in " ".join(result.output.split())
    help_text = CliRunner().invoke(app, ["run", "--help"], env={"COLUMNS": "200"}).output
    assert "--samples" in help_text and "--attempts" not in help_text


def test_gpus_are_checked_against_the_host_that_runs_the_sandboxes(tmp_path):
    gpu = _copy(tmp_path, "gpu")
    (gpu / "task.toml").write_text((gpu / "task.toml").read_text() + "gpus = 2\n")
    assert check_run([gpu], "oracle", samples=1, host_gpus=2) == []
    assert check_run([gpu], "oracle", samples=1, host_gpus=None) == []  # an external worker decides
    [problem] = check_run([gpu], "oracle", samples=1, host_gpus=1)
    assert problem == f"{gpu}: [environment].gpus = 2: this host has only 1 GPU (the NVIDIA driver lists 1)"


def test_skills_need_a_scaffold_that_reads_them(tmp_path):
    """As Harbor: oracle and nop ignore a task's skills_dir, claude-code, codex and opencode
    read it, any other model-driven scaffold refuses the task."""
    skills = _copy(tmp_path, "skills")
    toml = (
        (skills / "task.toml")
        .read_text()
        .replace("[environment]\n", '[environment]\nskills_dir = "/skills"\n')
    )
    (skills / "task.toml").write_text(toml)
    assert check_run([skills], "oracle", samples=1) == []
    assert check_run([skills], "nop", samples=1) == []
    for reads in ("claude-code", "codex", "opencode"):
        assert check_run([skills], reads, samples=1) == [], reads
    [problem] = check_run([skills], "terminus", samples=1)
    assert problem == (
        f"{skills}: [environment].skills_dir = '/skills': scaffold terminus does not read skills "
        "(claude-code, codex and opencode do)"
    )


def test_mcp_servers_need_a_scaffold_that_passes_them(tmp_path):
    """As Harbor: oracle and nop ignore a task's [[environment.mcp_servers]], claude-code
    writes them into its config, any other model-driven scaffold refuses the task."""
    mcp = _copy(tmp_path, "mcp")
    toml = (mcp / "task.toml").read_text() + (
        '\n[[environment.mcp_servers]]\nname = "mcp-server"\ntransport = "streamable-http"\n'
        'url = "http://mcp-server:8000/mcp"\n'
    )
    (mcp / "task.toml").write_text(toml)
    for scaffold in ("oracle", "nop", "claude-code"):
        assert check_run([mcp], scaffold, samples=1) == [], scaffold
    [problem] = check_run([mcp], "codex", samples=1)
    assert problem == (
        f"{mcp}: [[environment.mcp_servers]] (mcp-server): scaffold codex does not pass MCP servers "
        "to its agent (claude-code does)"
    )
