"""Task loading: the sample tasks, every error path, hashes, and fuzzed task.toml."""

import shutil
import string
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests._hypothesis import examples
from tests.trialflow.conftest import EXAMPLES, SAMPLE_TASKS
from trialflow.errors import TaskInvalid, UnsupportedEnvironment, UnsupportedFeature
from trialflow.tasks import gpu_requests, hash_tree, load_task, parse_size_mb


def make_task(
    root: Path,
    toml: str = 'version = "1.0"\n',
    *,
    instruction: str | None = "Do it.\n",
    dockerfile: str | None = "FROM trialflow-base:bookworm\n",
    test_sh: str | None = "echo 1\n",
    solve_sh: str | None = None,
) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "task.toml").write_text(toml)
    for rel, content in [
        ("instruction.md", instruction),
        ("environment/Dockerfile", dockerfile),
        ("tests/test.sh", test_sh),
        ("solution/solve.sh", solve_sh),
    ]:
        if content is not None:
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text(content)
    return root


@pytest.mark.parametrize("name", SAMPLE_TASKS)
def test_sample_tasks_load(name):
    task = load_task(EXAMPLES / name)
    assert task.name == name
    assert task.instruction.strip() or all(s.instruction.strip() for s in task.steps)
    assert task.dockerfile is not None and task.dockerfile.read_text().startswith(
        "FROM trialflow-base:bookworm"
    )
    assert task.solution_dir is not None and (task.solution_dir / "solve.sh").is_file()
    assert task.unknown_keys == ()
    assert task.image_tag == f"trialflow-task:{task.env_hash[:32]}"


def test_at_least_six_samples():
    assert {
        "create-file",
        "fix-bug",
        "multi-step",
        "reward-json",
        "verifier-timeout",
        "verifier-error",
    } <= set(SAMPLE_TASKS)


def test_full_harbor_config_is_read(tmp_path):
    toml = """
schema_version = "1.1"
[task]
name = "acme/full"
description = "d"
authors = [{ name = "A", email = "a@example.com" }]
[metadata]
difficulty = "hard"
tags = ["x"]
[verifier]
timeout_sec = 12
env = { K = "v" }
user = "tester"
[agent]
timeout_sec = 34.5
user = 1000
[environment]
build_timeout_sec = 56
docker_image = "img:1"
cpus = 2
memory = "2G"
storage = "512M"
workdir = "/srv"
env = { E = "1" }
gpus = 0
allow_internet = false
[solution]
env = { S = "2" }
"""
    task = load_task(make_task(tmp_path / "full", toml, dockerfile=None))
    c = task.config
    assert (
        c.schema_version == "1.1"
        and c.task.name == "acme/full"
        and c.task.authors[0].email == "a@example.com"
    )
    assert c.metadata["difficulty"] == "hard"
    assert (c.verifier.timeout_sec, c.verifier.env, c.verifier.user) == (12.0, {"K": "v"}, "tester")
    assert (c.agent.timeout_sec, c.agent.user) == (34.5, 1000)
    e = c.environment
    assert (e.build_timeout_sec, e.docker_image, e.cpus, e.memory_mb, e.storage_mb, e.workdir) == (
        56.0,
        "img:1",
        2,
        2048,
        512,
        "/srv",
    )
    assert c.solution.env == {"S": "2"}
    assert task.dockerfile is None and task.image_tag == "img:1"
    # The deprecated allow_internet becomes network_mode, as in Harbor; gpus = 0 asks for nothing.
    assert e.network_mode == "no-network" and e.allow_internet is None
    assert c.network_policy("agent").network_mode == "no-network"
    assert task.unknown_keys == ()


def test_defaults_when_sections_are_missing(tmp_path):
    task = load_task(make_task(tmp_path / "t", ""))
    c = task.config
    assert c.verifier.timeout_sec == 600.0 and c.agent.timeout_sec is None
    # Harbor 0.25: no resource limit unless the task sets one.
    assert (c.environment.cpus, c.environment.memory_mb, c.environment.storage_mb) == (None, None, None)
    assert c.schema_version == "1.4" and c.network_policy("verifier").network_mode == "public"
    assert task.solution_dir is None


def test_unknown_keys_are_kept_and_logged(tmp_path, caplog):
    caplog.set_level("INFO")
    task = load_task(make_task(tmp_path / "t", 'flavour = "x"\n[verifier]\nretries = 3\n[extra]\na = 1\n'))
    assert set(task.unknown_keys) == {"flavour", "extra", "verifier.retries"}
    assert task.config.verifier.model_extra == {"retries": 3}
    assert "verifier.retries" in caplog.text


@pytest.mark.parametrize(
    ("toml", "field"),
    [
        ("[verifier]\ntimeout_sec = 'soon'\n", "verifier.timeout_sec"),
        ("[verifier]\nenv = { A = 1 }\n", "verifier.env.A"),
        ('[environment]\nmemory = "lots"\n', "environment"),
        ('[environment]\nmemory = "1G"\nmemory_mb = 512\n', "environment"),
        ('[environment]\nnetwork_mode = "public"\nallowed_hosts = ["a.org"]\n', "environment"),
        (
            '[environment]\nnetwork_mode = "allowlist"\nallowed_hosts = ["http://a.org/"]\n',
            "environment.allowed_hosts",
        ),
        ('[agent]\nallowed_hosts = ["a.org"]\n', "agent"),
        ('[verifier]\nenvironment_mode = "shared"\n[verifier.environment]\ncpus = 1\n', "verifier"),
        ('[task]\ndescription = "no name"\n', "task.name"),
        ('[task]\nname = "no-org"\n', "task.name"),
        ('[[steps]]\nname = "a/b"\n', "steps.0.name"),
        ('[[steps]]\nname = "A"\n[[steps]]\nname = "a"\n', "steps"),
        ('artifacts = [{ source = "/x/../etc" }]\n', "artifacts.0.str"),
        ("verifier = 3\n", "verifier"),
        ('metadata = "x"\n', "metadata"),
    ],
)
def test_invalid_field_names_file_and_field(tmp_path, toml, field):
    with pytest.raises(TaskInvalid) as exc:
        load_task(make_task(tmp_path / "t", toml))
    assert exc.value.file == "task.toml"
    assert exc.value.field == field


@pytest.mark.parametrize(
    ("kwargs", "file"),
    [
        ({"instruction": None}, "instruction.md"),
        ({"instruction": "  \n"}, "instruction.md"),
        ({"dockerfile": None}, "environment/Dockerfile"),
        ({"test_sh": None}, "tests/test.sh"),
    ],
)
def test_missing_files(tmp_path, kwargs, file):
    """(Values Harbor accepts but that mean nothing are refusals: test_refused_features.)"""
    with pytest.raises(TaskInvalid) as exc:
        load_task(make_task(tmp_path / "t", **kwargs))
    assert exc.value.file == file and exc.value.field is None


def test_missing_toml_syntax_error_and_bad_encoding(tmp_path):
    root = make_task(tmp_path / "t")
    (root / "task.toml").unlink()
    with pytest.raises(TaskInvalid, match="task.toml: file is missing"):
        load_task(root)
    (root / "task.toml").write_text("[verifier\n")
    with pytest.raises(TaskInvalid, match="TOML syntax error"):
        load_task(root)
    (root / "task.toml").write_bytes(b"\xff\xfe")
    with pytest.raises(TaskInvalid, match="not UTF-8"):
        load_task(root)
    with pytest.raises(TaskInvalid, match="does not exist"):
        load_task(tmp_path / "nowhere")


def test_compose_environment_loads_and_yml_is_refused(tmp_path):
    """environment/docker-compose.yaml is loaded (tests/trialflow/test_compose.py has its
    rules); Harbor reads no other name, so a .yml alone is refused rather than ignored."""
    root = make_task(tmp_path / "t")
    (root / "environment" / "docker-compose.yml").write_text("services: {}\n")
    with pytest.raises(UnsupportedEnvironment, match="docker-compose.yml: rename it to docker-compose.yaml"):
        load_task(root)
    (root / "environment" / "docker-compose.yaml").write_text("services: {}\n")
    task = load_task(root)
    assert task.compose is not None and task.compose.services == ()


def test_hashes_are_stable_and_scoped(tmp_path):
    src = EXAMPLES / "fix-bug"
    a, b = tmp_path / "a", tmp_path / "b"
    shutil.copytree(src, a)
    shutil.copytree(src, b)
    ta, tb = load_task(a), load_task(b)
    assert (
        (ta.env_hash, ta.content_hash)
        == (tb.env_hash, tb.content_hash)
        == (load_task(src).env_hash, load_task(src).content_hash)
    )
    # Editing tests changes the task hash but not the image cache key.
    (b / "tests" / "test.sh").write_text("echo changed\n")
    tb = load_task(b)
    assert tb.env_hash == ta.env_hash and tb.content_hash != ta.content_hash
    # The executable bit and bytecode caches: one counts, the other does not.
    (b / "environment" / "app" / "__pycache__").mkdir()
    (b / "environment" / "app" / "__pycache__" / "stats.cpython-311.pyc").write_bytes(b"junk")
    assert load_task(b).env_hash == ta.env_hash
    (b / "environment" / "app" / "stats.py").chmod(0o755)
    assert load_task(b).env_hash != ta.env_hash


def test_hash_tree_distinguishes_renames(tmp_path):
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "a").write_text("1")
    h1 = hash_tree(tmp_path)
    (tmp_path / "x" / "a").rename(tmp_path / "x" / "b")
    assert hash_tree(tmp_path) != h1


@pytest.mark.parametrize(
    ("text", "mb"), [("2G", 2048), ("512M", 512), ("1.5g", 1536), ("2048K", 2), (" 3m ", 3)]
)
def test_parse_size(text, mb):
    assert parse_size_mb(text) == mb


@pytest.mark.parametrize("text", ["", "2", "G", "abcM", "1T", "4GB"])
def test_parse_size_rejects(text):
    with pytest.raises(ValueError):
        parse_size_mb(text)


_toml_text = st.text(alphabet=string.printable, max_size=200)


@settings(
    max_examples=examples(200), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(body=_toml_text)
def test_any_task_toml_loads_or_raises_task_invalid(tmp_path, body):
    """Whatever bytes task.toml holds, loading never fails with anything but TaskInvalid."""
    root = make_task(tmp_path / "fuzz", body)
    try:
        task = load_task(root)
    except TaskInvalid as e:
        assert e.file == "task.toml"
    except UnsupportedFeature as e:
        assert e.features
    else:
        assert task.config.verifier.timeout_sec > 0


_scalar = st.one_of(
    st.integers(-5, 5),
    st.floats(allow_nan=True),
    st.text(max_size=5),
    st.booleans(),
    st.lists(st.integers(), max_size=2),
)


@settings(
    max_examples=examples(200), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    section=st.sampled_from(["verifier", "agent", "environment", "solution"]),
    key=st.sampled_from(
        [
            "timeout_sec",
            "env",
            "user",
            "cpus",
            "memory",
            "memory_mb",
            "workdir",
            "build_timeout_sec",
            "docker_image",
            "unknown",
        ]
    ),
    value=_scalar,
)
def test_wrong_types_name_the_field(tmp_path, section, key, value):
    import tomllib

    toml = f"[{section}]\n{key} = {_toml_value(value)}\n"
    try:
        tomllib.loads(toml)
    except tomllib.TOMLDecodeError:
        return
    root = make_task(tmp_path / "fuzz", toml)
    try:
        load_task(root)
    except TaskInvalid as e:
        # Harbor's legacy `memory` is converted before field validation: the section is named.
        assert e.field is not None and e.field.startswith(section if key == "memory" else f"{section}.{key}")
    except UnsupportedFeature as e:
        assert any(f"[{section}].{key}" in f for f in e.features)


def _toml_value(v) -> str:
    import json
    import math

    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return "nan" if math.isnan(v) else ("inf" if v == math.inf else "-inf" if v == -math.inf else repr(v))
    return json.dumps(v)


@pytest.mark.parametrize(
    ("toml", "names"),
    [
        ('[environment]\nos = "Windows"\n', "[environment].os"),
        ('[environment]\ntpu = { type = "v6e", topology = "2x2" }\n', "[environment].tpu"),
        (
            '[[environment.mcp_servers]]\nname = "db"\nurl = "http://x/sse"\nheaders = { X = "${T}" }\n',
            "mcp_servers]] (db): MCP headers",
        ),
        ('[[steps]]\nname = "one"\n[steps.agent]\ntimeout_sec = 0\n', "'one' agent.timeout_sec"),
        ('[[steps]]\nname = "one"\n[[steps.verifier.collect]]\ncommand = "true"\n', "collect"),
        ('[verifier.environment]\nworkdir = "rel"\n', "[verifier.environment].workdir"),
        ('[verifier.environment]\nos = "windows"\n', "[verifier.environment].os"),
        ('[[verifier.collect]]\ncommand = "true"\n', "[[verifier.collect]]"),
        ('artifacts = [{ source = "/db", service = "db" }]\n', "service 'db'"),
        ("[verifier]\ntimeout_sec = -1\n", "[verifier].timeout_sec"),
        ("[agent]\ntimeout_sec = 0\n", "[agent].timeout_sec"),
        ("[environment]\nmemory_mb = 0\n", "[environment].memory_mb"),
        ('[environment]\nmemory = "-1G"\n', "[environment].memory_mb"),
        ("[environment]\ncpus = -2\n", "[environment].cpus"),
        ('[environment]\nworkdir = "relative/dir"\n', "[environment].workdir"),
        (
            '[[steps]]\nname = "one"\n[steps.verifier.environment]\nos = "windows"\n',
            "'one': [steps.verifier.environment].os",
        ),
    ],
)
def test_refused_features_are_named(tmp_path, toml, names):
    """Fields Harbor accepts that trialflow does not do: refused at load, naming the field."""
    with pytest.raises(UnsupportedFeature) as exc:
        load_task(make_task(tmp_path / "t", toml))
    assert any(names in f for f in exc.value.features), exc.value.features


def test_every_refusal_is_listed_at_once(tmp_path):
    toml = '[environment]\nos = "windows"\ncpus = -1\n[[steps]]\nname = "a"\n[steps.verifier]\ntimeout_sec = -1\n'
    with pytest.raises(UnsupportedFeature) as exc:
        load_task(make_task(tmp_path / "t", toml, instruction=None))  # refusal before missing files
    assert len(exc.value.features) == 3


def test_gpus_and_skills_load_and_each_gpu_request_is_named(tmp_path):
    """GPUs and skills are the host's and the scaffold's to give (trialflow.preflight), not
    refused at load; every environment asking for GPUs is named."""
    toml = (
        '[environment]\ngpus = 2\ngpu_types = ["H100"]\nskills_dir = "/skills"\n'
        "[verifier.environment]\ngpus = 1\n"
        '[[steps]]\nname = "one"\n[steps.verifier.environment]\ngpus = 4\n[[steps]]\nname = "two"\n'
    )
    root = make_task(tmp_path / "t", toml, instruction=None)
    for step in ("one", "two"):
        (root / "steps" / step).mkdir(parents=True)
        (root / "steps" / step / "instruction.md").write_text("Do it.\n")
    task = load_task(root)
    assert task.config.environment.skills_dir == "/skills"
    assert gpu_requests(task.config) == [
        ("[environment]", 2),
        ("[verifier.environment]", 1),
        ("[[steps]] 'one': [steps.verifier.environment]", 4),
    ]
    assert gpu_requests(load_task(make_task(tmp_path / "z", "[environment]\ngpus = 0\n")).config) == []


def test_network_fields_resolve_per_phase(tmp_path):
    toml = (
        '[environment]\nnetwork_mode = "allowlist"\n'
        'allowed_hosts = ["PyPI.org.", "*.Example.com", "10.0.0.0/8"]\n'
        '[verifier]\nnetwork_mode = "public"\n'
    )
    c = load_task(make_task(tmp_path / "t", toml)).config
    agent = c.network_policy("agent")
    assert agent.network_mode == "allowlist"
    assert agent.allowed_hosts == ("pypi.org", "*.example.com", "10.0.0.0/8")
    assert c.network_policy("verifier").network_mode == "public"


def test_allow_internet_yields_to_explicit_network_mode(tmp_path):
    toml = '[environment]\nallow_internet = false\nnetwork_mode = "public"\n'
    assert load_task(make_task(tmp_path / "t", toml)).config.environment.network_mode == "public"


def test_artifacts_include_the_convention_dir(tmp_path):
    toml = 'artifacts = ["/app/out.txt", { source = "/var/log/app", destination = "logs/app" }]\n'
    entries = load_task(make_task(tmp_path / "t", toml)).config.artifact_entries()
    assert [(e.source, e.relative_path) for e in entries] == [
        ("/logs/artifacts", "logs/artifacts"),
        ("/app/out.txt", "app/out.txt"),
        ("/var/log/app", "logs/app"),
    ]


def test_instruction_canary_lines_are_stripped(tmp_path):
    text = "<!-- BENCHMARK DATA canary GUID 1234 -->\n# another canary line\n\nDo the thing.\n"
    assert load_task(make_task(tmp_path / "t", instruction=text)).instruction == "Do the thing.\n"


@pytest.mark.parametrize(
    ("value", "host", "expected"),
    [
        ("${A}", {"A": "x"}, "x"),
        ("${A}", {"A": ""}, ""),  # set but empty: Harbor takes it (no shell ':-' semantics)
        ("${A:-dflt}", {}, "dflt"),
        ("${A:-dflt}", {"A": ""}, ""),
        ("pre-${A}", {"A": "x"}, "pre-${A}"),  # not a whole-value template: literal
        ("plain", {}, "plain"),
    ],
)
def test_env_templates_resolve_as_in_harbor(value, host, expected):
    from trialflow.tasks import resolve_env

    assert resolve_env({"K": value}, host) == {"K": expected}


def test_env_template_without_value_or_default_is_a_task_error():
    from trialflow.errors import TaskEnvMissing
    from trialflow.tasks import resolve_env

    with pytest.raises(TaskEnvMissing, match="'A' not found"):
        resolve_env({"K": "${A}"}, {})


def test_separate_verifier_environment_from_tests_dockerfile(tmp_path):
    """Harbor's image precedence: tests/Dockerfile builds the verifier's own image (it brings
    /tests); its environment's resources and workdir apply; tests/ is its cache key."""
    root = make_task(tmp_path / "t", '[verifier.environment]\nmemory_mb = 256\nworkdir = "/g"\n')
    (root / "tests" / "Dockerfile").write_text("FROM trialflow-base:bookworm\nCOPY . /tests/\n")
    task = load_task(root)
    sv = task.separate_verifier
    assert sv is not None and sv.bundled_tests
    assert (sv.config.memory_mb, sv.config.workdir) == (256, "/g")
    assert sv.image.context_dir == root / "tests" and sv.image.tag.startswith("trialflow-verifier:")
    (root / "tests" / "test.sh").write_text("echo 0\n")
    assert load_task(root).separate_verifier.image.tag != sv.image.tag
    assert load_task(root).image_tag == task.image_tag  # the agent's image does not change


def test_separate_verifier_without_its_own_image_uses_the_agents(tmp_path):
    task = load_task(make_task(tmp_path / "t", '[verifier]\nenvironment_mode = "separate"\n'))
    sv = task.separate_verifier
    assert sv is not None and not sv.bundled_tests and sv.image == task.image
    prebuilt = load_task(make_task(tmp_path / "p", '[verifier.environment]\ndocker_image = "grader:1"\n'))
    assert prebuilt.separate_verifier.image.tag == "grader:1" and prebuilt.separate_verifier.bundled_tests
    assert load_task(make_task(tmp_path / "s", "")).separate_verifier is None


def test_compose_verifier_environment_is_refused(tmp_path):
    root = make_task(tmp_path / "t", '[verifier]\nenvironment_mode = "separate"\n')
    (root / "tests" / "docker-compose.yaml").write_text("services: {}\n")
    with pytest.raises(UnsupportedEnvironment, match="tests/docker-compose.yaml"):
        load_task(root)
