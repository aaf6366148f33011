"""environment/docker-compose.yaml as Compose reads it and as trialflow can honour it (pure:
trialflow.compose). The files mirror Harbor's public compose tasks (harbor-cookbook's
multi-container, mcp-tools, simulated-user, computer-use recipes): `main` overridden only
with depends_on, services built from subdirectories with CMD healthchecks in Go durations."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.trialflow.conftest import EXAMPLES
from trialflow.compose import (
    MAIN,
    ComposeInvalid,
    ComposeRefused,
    Condition,
    Dependency,
    interpolation_env,
    load_compose,
)
from trialflow.compose.values import InterpolationError, interpolate, load_yaml, parse_bytes, parse_duration
from trialflow.errors import TaskInvalid, UnsupportedEnvironment, UnsupportedFeature
from trialflow.tasks import load_task, service_image

# harbor-cookbook recipes/mcp-tools/environment/docker-compose.yaml, as published
MCP_TOOLS = """\
services:
  main:
    depends_on:
      mcp-server:
        condition: service_healthy

  mcp-server:
    build:
      context: ./mcp-server
    expose:
      - "8000"
    healthcheck:
      test: ["CMD", "python", "-c", "import socket; s=socket.create_connection(('localhost',8000),timeout=2); s.close()"]
      interval: 2s
      timeout: 5s
      retries: 15
      start_period: 5s
"""


def _env_dir(tmp_path: Path, compose: str, services: tuple[str, ...] = ("mcp-server",)) -> Path:
    env = tmp_path / "environment"
    for name in services:
        (env / name).mkdir(parents=True, exist_ok=True)
        (env / name / "Dockerfile").write_text("FROM trialflow-base:bookworm\n")
    env.mkdir(exist_ok=True)
    (env / "docker-compose.yaml").write_text(compose)
    return env / "docker-compose.yaml"


def _load(tmp_path: Path, compose: str, env: dict[str, str] | None = None, **kw):
    services = kw.pop("services", ("mcp-server", "api", "db", "a", "b"))
    return load_compose(_env_dir(tmp_path, compose, services), env or {}, **kw)


# -- values ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("$A and ${A}", "1 and 1"),
        ("${UNSET}", ""),
        ("${UNSET:-dflt}", "dflt"),
        ("${EMPTY:-dflt}", "dflt"),
        ("${EMPTY-dflt}", ""),
        ("${UNSET-dflt}", "dflt"),
        ("${UNSET:-${A}}", "1"),
        ("${A:+alt}", "alt"),
        ("${EMPTY:+alt}", ""),
        ("${EMPTY+alt}", "alt"),
        ("$$A ${A}$$", "$A 1$"),
        ("no vars", "no vars"),
    ],
)
def test_interpolation_follows_the_compose_spec(text, expected):
    assert interpolate(text, {"A": "1", "EMPTY": ""}) == expected


@pytest.mark.parametrize("text", ["${", "${A", "$ x", "${1A}", "${A:-x"])
def test_malformed_interpolation_is_an_error(text):
    with pytest.raises(InterpolationError):
        interpolate(text, {"A": "1"})


def test_required_variables_fail_only_when_strict():
    with pytest.raises(InterpolationError, match="KEY is missing a value: set KEY"):
        interpolate("${KEY:?set KEY}", {})
    with pytest.raises(InterpolationError):
        interpolate("${KEY?}", {})
    assert interpolate("${KEY?}", {"KEY": ""}) == ""  # set (even empty) satisfies `?`
    assert interpolate("${KEY:?x}", {}, strict=False) == ""


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("1m30s", 90.0), ("2s", 2.0), ("500ms", 0.5), ("1.5h", 5400.0), ("0", 0.0), ("1h2m3s4ms", 3723.004)],
)
def test_durations_are_go_durations(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["10", "", "1x", "-1s", "s", "1m 30s"])
def test_bad_durations(text):
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration(text)


def test_byte_sizes():
    assert parse_bytes("512m") == 512 << 20
    assert parse_bytes("1g") == parse_bytes("1GiB") == parse_bytes("1gb") == 1 << 30
    assert parse_bytes(4096) == 4096 and parse_bytes("1.5k") == 1536
    with pytest.raises(ValueError):
        parse_bytes("lots")


def test_yaml_is_read_with_yaml_1_2_scalars():
    doc = load_yaml("a: yes\nb: on\nc: 1:30\nd: true\ne: 0755\nf: 0x1f\nbase: &b {x: 1}\nm: {<<: *b, y: 2}\n")
    assert doc == {
        "a": "yes",
        "b": "on",
        "c": "1:30",
        "d": True,
        "e": 755,
        "f": 31,
        "base": {"x": 1},
        "m": {"x": 1, "y": 2},
    }


# -- what a file means -----------------------------------------------------------------


def test_the_public_mcp_tools_file(tmp_path):
    project = _load(tmp_path, MCP_TOOLS)
    (svc,) = project.services
    assert svc.name == "mcp-server" and svc.build is not None
    assert svc.build.context == (tmp_path / "environment" / "mcp-server").resolve()
    assert svc.healthcheck is not None and svc.healthcheck.test is not None
    assert svc.healthcheck.test[:2] == ("CMD", "python")
    hc = svc.healthcheck
    assert (hc.interval_s, hc.timeout_s, hc.retries, hc.start_period_s) == (2.0, 5.0, 15, 5.0)
    assert project.main_depends_on == {"mcp-server": Dependency(condition=Condition.HEALTHY)}
    assert project.order == ("mcp-server", MAIN)
    assert project.host_names == (MAIN, "mcp-server")


def test_depends_on_short_and_long_syntax_and_order(tmp_path):
    project = _load(
        tmp_path,
        """
services:
  main: {depends_on: [api]}
  api:
    image: img
    depends_on:
      db: {condition: service_healthy}
      b: {condition: service_completed_successfully, required: true}
      ghost: {condition: service_started, required: false}
  db: {image: img, depends_on: [a]}
  a: {image: img}
  b: {image: img}
  later: {image: img, profiles: [debug]}
""",
    )
    assert project.main_depends_on == {"api": Dependency()}
    assert project.service("api").depends_on == {
        "db": Dependency(condition=Condition.HEALTHY),
        "b": Dependency(condition=Condition.COMPLETED),
    }  # the optional undefined one is dropped
    order = project.order
    assert order.index("a") < order.index("db") < order.index("api") < order.index(MAIN)
    assert order.index("b") < order.index("api")
    assert "later" not in order  # a profile's service is not started by `up`


@pytest.mark.parametrize(
    ("compose", "field", "match"),
    [
        (
            "services:\n  a: {image: i, depends_on: [b]}\n  b: {image: i, depends_on: [a]}\n",
            "depends_on",
            "cycle",
        ),
        ("services:\n  a: {image: i, depends_on: [nope]}\n", "services.a.depends_on.nope", "undefined"),
        ("services:\n  a: {image: i, depends_on: [a]}\n", "services.a.depends_on.a", "itself"),
        (
            "services:\n  a: {image: i, depends_on: {b: {condition: ready}}}\n  b: {image: i}\n",
            "condition",
            "one of",
        ),
        (
            "services:\n  a: {image: i, healthcheck: {interval: 10}}\n",
            "services.a.healthcheck.interval",
            "duration",
        ),
        (
            "services:\n  a: {image: i, healthcheck: {test: [CURL, x]}}\n",
            "services.a.healthcheck.test",
            "CMD",
        ),
        ("services:\n  a: {command: x}\n", "services.a", "neither image nor build"),
        ("services:\n  a: {image: '${'}\n", "services.a.image", "interpolation"),
        ("services: [a]\n", "services", "mapping"),
        (
            "services:\n  a: {image: i, depends_on: {main: {condition: service_healthy}}}\n",
            "main",
            "no healthcheck",
        ),
        ("services:\n  a: {build: ./missing}\n", "services.a.build.context", "not found"),
        ("services:\n  a: [\n", "", "YAML"),
    ],
)
def test_what_compose_itself_rejects_is_invalid(tmp_path, compose, field, match):
    with pytest.raises(ComposeInvalid, match=match) as exc:
        _load(tmp_path, compose)
    assert field in exc.value.field or field in str(exc.value)


def test_healthcheck_forms(tmp_path):
    project = _load(
        tmp_path,
        """
services:
  a: {image: i, healthcheck: {test: "curl -f http://localhost/", interval: 1m30s}}
  b: {image: i, healthcheck: {test: [CMD-SHELL, "pg_isready"]}}
  db: {image: i, healthcheck: {test: [NONE]}}
  api: {image: i, healthcheck: {disable: true}}
""",
    )
    hc = {s.name: s.healthcheck for s in project.services}
    assert hc["a"] is not None and hc["a"].test == ("CMD-SHELL", "curl -f http://localhost/")
    assert hc["a"].interval_s == 90.0
    assert hc["b"] is not None and hc["b"].test == ("CMD-SHELL", "pg_isready")
    assert hc["db"] is not None and hc["db"].disabled
    assert hc["api"] is not None and hc["api"].disabled


def test_environment_forms_and_variables(tmp_path):
    (tmp_path / "environment").mkdir()
    (tmp_path / "environment" / "svc.env").write_text("FROM_FILE=1\nOVERRIDDEN=file\nBARE_FILE\n")
    project = _load(
        tmp_path,
        """
services:
  main:
    environment: {MAIN_ONLY: "yes"}
  a:
    image: "${REGISTRY:-local}/a"
    env_file: svc.env
    environment:
      - LIST=1
      - OVERRIDDEN=list
      - BARE
      - BARE_UNSET
      - INTERPOLATED=${TOKEN}-x
  b:
    image: i
    environment: {MAP: 2, BOOL: true, NULL_SET: null, NULL_UNSET: null}
    command: python3 -m http.server "8000"
""",
        env={"BARE": "from-host", "TOKEN": "t", "NULL_SET": "n", "BARE_FILE": "bf"},
    )
    a, b = project.service("a"), project.service("b")
    assert a.image == "local/a"
    assert a.environment == {
        "FROM_FILE": "1",
        "OVERRIDDEN": "list",
        "BARE_FILE": "bf",
        "LIST": "1",
        "BARE": "from-host",
        "INTERPOLATED": "t-x",
    }
    assert b.environment == {"MAP": "2", "BOOL": "true", "NULL_SET": "n"}
    assert b.command == ("python3", "-m", "http.server", "8000")
    assert project.main_environment == {"MAIN_ONLY": "yes"}


def test_harbors_variables_are_set(tmp_path):
    env = interpolation_env(
        {"HOME": "/root", "MAIN_IMAGE_NAME": "from-host"},
        {"TASK_VAR": "v"},
        main_image="trialflow-task:abc",
        context_dir=tmp_path,
        cpus=1,
        memory_mb=2048,
    )
    assert env["MAIN_IMAGE_NAME"] == "trialflow-task:abc"  # Harbor's own win over the host's
    assert (env["CPUS"], env["MEMORY"], env["TASK_VAR"], env["CONTEXT_DIR"]) == (
        "1",
        "2048M",
        "v",
        str(tmp_path),
    )
    assert "PREBUILT_IMAGE_NAME" not in env
    project = _load(tmp_path, "services:\n  twin: {image: '${MAIN_IMAGE_NAME}'}\n", env=env)
    assert project.service("twin").image == "trialflow-task:abc"


def test_every_refusal_is_listed_with_its_key(tmp_path):
    (tmp_path / "outside").mkdir()
    with pytest.raises(ComposeRefused) as exc:
        _load(
            tmp_path,
            """
version: "3.8"
x-common: &common {image: i}
networks: {backend: {}}
volumes: {data: {}}
services:
  main:
    image: other
    depends_on: [a]
  a:
    <<: *common
    ports: ["8080:80"]
    privileged: true
    cap_add: [NET_ADMIN]
    network_mode: host
    networks: [backend]
    volumes: ["data:/data", "./:/src", "../outside:/o:ro"]
    security_opt: [seccomp=unconfined]
    pid: host
    devices: ["/dev/kvm"]
    build: {context: "https://github.com/x/y.git"}
    frobnicate: 1
    deploy: {replicas: 3}
  b: {image: i, expose: ["80"]}
  db: {image: i, expose: ["80/tcp"]}
""",
        )
    reasons = exc.value.reasons
    for needle in (
        "networks: networks other than the default",
        "volumes: named volumes",
        "services.main.image: the main service is built",
        "services.a.ports: ports published on the host",
        "services.a.privileged: privileged containers are refused",
        "services.a.cap_add",
        "services.a.network_mode",
        "services.a.networks",
        "services.a.volumes[0]: named volume 'data'",
        "services.a.volumes[1]: a writable bind mount",
        "services.a.volumes[2]: '../outside' is outside the task's environment/ directory",
        "services.a.security_opt",
        "services.a.pid",
        "services.a.devices",
        "services.a.build.context: 'https://github.com/x/y.git'",
        "services.a.frobnicate: not a key",
        "services.a.deploy.replicas",
        "services.db.expose: port 80 is also exposed by b",
    ):
        assert any(needle in r for r in reasons), (needle, reasons)
    assert len(reasons) == 18


def test_what_is_kept(tmp_path):
    project = _load(
        tmp_path,
        """
services:
  a:
    build: {context: ./a, args: {V: "1", FROM_ENV: null}, target: prod}
    entrypoint: []
    working_dir: /srv
    user: "1000"
    init: true
    read_only: true
    restart: on-failure:3
    mem_limit: 256m
    cpus: 0.5
    pids_limit: 64
    cap_drop: [cap_chown]
    shm_size: 64m
    volumes: ["./a:/cfg:ro", "/cache", {type: tmpfs, target: /scratch}]
    tmpfs: [/run/a]
    labels: [team=x]
    container_name: alpha
    hostname: alpha-host
    logging: {driver: none}
    privileged: false
    networks: [default]
    deploy: {resources: {limits: {memory: 128m}, reservations: {cpus: "0.1"}}}
""",
        env={"FROM_ENV": "e"},
    )
    a = project.service("a")
    assert a.build is not None and a.build.args == {"V": "1", "FROM_ENV": "e"} and a.build.target == "prod"
    assert a.entrypoint == () and a.working_dir == "/srv" and a.user == "1000"
    assert (a.init, a.read_only, a.restart) == (True, True, "on-failure:3")
    assert (a.mem_limit, a.cpus, a.pids_limit, a.shm_size) == (128 << 20, 0.5, 64, 64 << 20)
    assert a.cap_drop == ("CHOWN",) and a.labels == {"team": "x"}
    assert [b.target for b in a.binds] == ["/cfg"] and a.anonymous_volumes == ("/cache",)
    assert set(a.tmpfs) == {"/scratch", "/run/a"}
    assert project.host_names == (MAIN, "a", "alpha", "alpha-host")


def test_a_service_image_is_tagged_under_trialflows_name(tmp_path):
    project = _load(tmp_path, "services:\n  a: {build: ./a, image: 'python:3.12-slim'}\n")
    svc = project.service("a")
    image = service_image("task t", svc, 60)
    assert image.tag.startswith("trialflow-service:")  # never python:3.12-slim
    (tmp_path / "environment" / "a" / "Dockerfile").write_text("FROM trialflow-base:trixie\n")
    changed = service_image("task t", svc, 60)
    assert changed.tag != image.tag  # the Dockerfile is in the key


# -- the loader ----------------------------------------------------------------------------


def _task(root: Path, compose: str | None, name: str = "docker-compose.yaml", toml: str = "") -> Path:
    (root / "environment" / "api").mkdir(parents=True)
    (root / "environment" / "Dockerfile").write_text("FROM trialflow-base:bookworm\n")
    (root / "environment" / "api" / "Dockerfile").write_text("FROM trialflow-base:bookworm\n")
    if compose is not None:
        (root / "environment" / name).write_text(compose)
    (root / "tests").mkdir()
    (root / "tests" / "test.sh").write_text("#!/bin/bash\n")
    (root / "instruction.md").write_text("do it\n")
    (root / "task.toml").write_text(toml)
    return root


def test_the_sample_task_loads_its_services():
    task = load_task(EXAMPLES / "compose-services")
    assert task.compose is not None
    assert task.compose.order == ("kv", "api-server", MAIN)
    assert task.compose.service("api-server").environment == {"KV_URL": "http://kv:6000"}


def test_task_refusals_list_compose_and_task_toml_problems_together(tmp_path):
    root = _task(
        tmp_path / "t",
        "services:\n  api: {build: ./api, ports: ['80:80']}\n",
        toml='[environment]\nos = "windows"\n',
    )
    with pytest.raises(UnsupportedFeature) as exc:
        load_task(root)
    text = str(exc.value)
    assert "only Linux containers" in text and "environment/docker-compose.yaml: services.api.ports" in text


def test_invalid_compose_names_the_file_and_field(tmp_path):
    root = _task(tmp_path / "t", "services:\n  api: {build: ./api, healthcheck: {retries: -1}}\n")
    with pytest.raises(TaskInvalid) as exc:
        load_task(root)
    assert (exc.value.file, exc.value.field) == (
        "environment/docker-compose.yaml",
        "services.api.healthcheck.retries",
    )


def test_yml_is_not_read_by_harbor_so_it_is_refused(tmp_path):
    root = _task(tmp_path / "t", "services: {}\n", name="docker-compose.yml")
    with pytest.raises(UnsupportedEnvironment, match="rename it to docker-compose.yaml"):
        load_task(root)


def test_task_env_feeds_compose_variables_leniently_at_load(tmp_path, monkeypatch):
    monkeypatch.delenv("TF_TEST_UNSET", raising=False)
    monkeypatch.setenv("TF_TEST_SET", "here")
    compose = (
        "services:\n  api:\n    build: ./api\n    environment:\n"
        '      - "A=${TASK_A}"\n      - "B=${TASK_B}"\n      - "C=${NEED:?set it}"\n'
    )
    toml = '[environment.env]\nTASK_A = "${TF_TEST_SET}"\nTASK_B = "${TF_TEST_UNSET}"\n'
    task = load_task(_task(tmp_path / "t", compose, toml=toml))
    assert task.compose is not None
    assert task.compose.service("api").environment == {"A": "here", "B": "", "C": ""}
