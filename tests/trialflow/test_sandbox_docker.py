"""DockerBackend against the real engine: images, exec, files, limits, attach, reaper."""

import contextlib
import os
import shutil
import time
import uuid

import docker.errors
import pytest

from tests.trialflow.conftest import EXAMPLES, fixture_task
from trialflow.errors import (
    BaseImageUnavailable,
    ImageBuildFailed,
    ImageBuildTimeout,
    ImageUnavailable,
    SandboxLost,
    SandboxPathNotFound,
)
from trialflow.sandbox import (
    LABEL_CREATED_AT,
    LABEL_MANAGED,
    LABEL_TRIAL_ID,
    Mount,
    reap_containers,
)
from trialflow.sandbox.docker import resolve_env
from trialflow.tasks import load_task

pytestmark = pytest.mark.docker


@pytest.fixture
def fresh_task(tmp_path, docker_client):
    """A copy of create-file whose environment hash nobody has built yet; image removed after."""
    root = tmp_path / "fresh"
    shutil.copytree(EXAMPLES / "create-file", root)
    with (root / "environment" / "Dockerfile").open("a") as fh:
        fh.write(f"RUN echo {uuid.uuid4().hex} > /etc/build-marker\n")
    task = load_task(root)
    yield task
    with contextlib.suppress(docker.errors.ImageNotFound):
        docker_client.images.remove(task.image_tag, force=True)


async def test_build_then_cache_hit(backend, fresh_task, sandbox_for):
    first = await backend.ensure_image(fresh_task)
    assert first.built and first.tag == fresh_task.image_tag
    t0 = time.monotonic()
    sb = await sandbox_for(fresh_task)  # create() must not rebuild
    assert time.monotonic() - t0 < first.duration_s + 5
    again = await backend.ensure_image(fresh_task)
    assert not again.built and again.image_id == first.image_id
    res = await sb.exec("cat /etc/build-marker")
    assert res.ok and len(res.stdout.strip()) == 32


async def test_concurrent_creates_build_once(backend, fresh_task):
    import asyncio

    infos = await asyncio.gather(*(backend.ensure_image(fresh_task) for _ in range(3)))
    assert [i.built for i in infos].count(True) == 1


async def test_exec_exit_codes_are_data(backend, sandbox_for):
    sb = await sandbox_for(load_task(EXAMPLES / "create-file"))
    res = await sb.exec("echo out; echo err >&2; exit 3")
    assert (res.exit_code, res.stdout, res.stderr, res.timed_out) == (3, "out\n", "err\n", False)
    argv = await sb.exec(["printf", "%s|", "a b", "c"])
    assert argv.stdout == "a b|c|"
    missing = await sb.exec(["/no/such/binary"])
    assert missing.exit_code != 0 and not missing.timed_out


async def test_exec_timeout_kills_the_process_group(sandbox_for):
    sb = await sandbox_for(load_task(EXAMPLES / "create-file"))
    res = await sb.exec("sleep 301 & sleep 302; echo never", timeout_s=1.0)
    assert res.timed_out and not res.ok
    assert 1.0 <= res.duration_s < 10
    assert "never" not in res.stdout
    ps = await sb.exec("ps -eo args")
    assert "sleep 301" not in ps.stdout and "sleep 302" not in ps.stdout
    # A command that exits 124 by itself before the deadline is not a timeout.
    own = await sb.exec("exit 124", timeout_s=30)
    assert own.exit_code == 124 and not own.timed_out


async def test_exec_env_user_workdir(sandbox_for):
    sb = await sandbox_for(load_task(fixture_task("limits")))
    res = await sb.exec('echo "$GREETING $FROM_HOST $EXTRA $(pwd) $(id -un)"', env={"EXTRA": "x"})
    assert res.stdout == "hello fallback x /work root\n"
    res = await sb.exec("echo $(pwd) $(id -un)", user="nobody", workdir="/tmp")
    assert res.stdout == "/tmp nobody\n"


async def test_output_is_capped_keeping_the_tail(make_backend):
    be = make_backend(output_cap_bytes=1000)
    sb = await be.create(load_task(EXAMPLES / "create-file"), trial_id="cap")
    try:
        await sb.start()
        res = await sb.exec("head -c 5000 /dev/zero | tr '\\0' a; echo END")
        assert res.stdout.startswith("[trialflow: ") and "truncated" in res.stdout
        assert res.stdout.endswith("aaaaEND\n")
        assert res.stdout.count("a") < 1100
    finally:
        await sb.stop()


async def test_upload_download_roundtrip(tmp_path, sandbox_for):
    sb = await sandbox_for(load_task(EXAMPLES / "create-file"))
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (src / "run.sh").chmod(0o755)
    (src / "sub" / "data.bin").write_bytes(bytes(range(256)) * 10)
    await sb.upload(src, "/dst/deep")
    res = await sb.exec("/dst/deep/run.sh && stat -c %a /dst/deep/run.sh && wc -c < /dst/deep/sub/data.bin")
    assert res.stdout.split() == ["hi", "755", "2560"]
    await sb.upload(src / "run.sh", "/single")
    assert (await sb.exec("test -x /single/run.sh")).ok

    back = await sb.download("/dst/deep", tmp_path / "back")
    assert back == tmp_path / "back"
    assert (back / "sub" / "data.bin").read_bytes() == (src / "sub" / "data.bin").read_bytes()
    assert os.access(back / "run.sh", os.X_OK)
    one = await sb.download("/single/run.sh", tmp_path / "one")
    assert one == tmp_path / "one" / "run.sh" and one.read_text() == "#!/bin/sh\necho hi\n"
    with pytest.raises(SandboxPathNotFound):
        await sb.download("/no/such/path", tmp_path / "x")
    with pytest.raises(FileNotFoundError):
        await sb.upload(tmp_path / "absent", "/x")


async def test_limits_labels_and_no_network(docker_client, backend, sandbox_for):
    task = load_task(fixture_task("limits"))
    sb = await sandbox_for(task, labels={"trialflow.attempt": "2"})
    attrs = docker_client.api.inspect_container(sb.id)
    hc = attrs["HostConfig"]
    assert hc["NanoCpus"] == 500_000_000
    assert hc["Memory"] == 300 * 1024 * 1024 and hc["MemorySwap"] == 300 * 1024 * 1024
    assert hc["NetworkMode"] == "none" and hc["Init"] is True  # its own namespace, no route out (issue 9)
    labels = attrs["Config"]["Labels"]
    assert labels[LABEL_MANAGED] == "true" and labels[LABEL_TRIAL_ID] == "test-limits"
    assert abs(int(labels[LABEL_CREATED_AT]) - time.time()) < 120
    assert labels["trialflow.attempt"] == "2" and labels["trialflow.task"] == "limits"
    assert labels["trialflow.test_run"] == backend.labels["trialflow.test_run"]
    assert attrs["Config"]["WorkingDir"] == "/work"


async def test_cpus_above_host_are_clamped(tmp_path, docker_client, sandbox_for):
    root = tmp_path / "big"
    shutil.copytree(EXAMPLES / "create-file", root)
    toml = (root / "task.toml").read_text().replace("cpus = 1", "cpus = 512")
    (root / "task.toml").write_text(toml)
    sb = await sandbox_for(load_task(root))
    ncpu = docker_client.info()["NCPU"]
    assert docker_client.api.inspect_container(sb.id)["HostConfig"]["NanoCpus"] == ncpu * 1_000_000_000


async def test_read_only_mounts(tmp_path, sandbox_for):
    host = tmp_path / "tool"
    host.mkdir()
    (host / "cli").write_text("#!/bin/sh\necho from-host\n")
    (host / "cli").chmod(0o755)
    sb = await sandbox_for(load_task(EXAMPLES / "create-file"), mounts=[Mount(str(host), "/opt/tool")])
    assert (await sb.exec("/opt/tool/cli")).stdout == "from-host\n"
    write = await sb.exec("touch /opt/tool/new")
    assert write.exit_code != 0 and "Read-only" in write.stderr


async def test_attach_stop_and_lost(backend, sandbox_for):
    sb = await sandbox_for(load_task(EXAMPLES / "create-file"))
    await sb.exec("echo state > /tmp/s")
    again = await backend.attach(sb.id)
    assert again.id == sb.id and (await again.exec("cat /tmp/s")).stdout == "state\n"
    await sb.start()  # idempotent on a running sandbox
    await sb.stop()
    await sb.stop()
    await again.stop()
    with pytest.raises(SandboxLost):
        await again.exec("true")
    with pytest.raises(SandboxLost):
        await backend.attach(sb.id)


async def test_attach_refuses_unmanaged_container(docker_client, backend, base_image):
    c = docker_client.containers.create(
        "trialflow-base:bookworm", ["true"], name=f"unmanaged-{uuid.uuid4().hex[:8]}"
    )
    try:
        with pytest.raises(SandboxLost, match="not a trialflow sandbox"):
            await backend.attach(c.name)
    finally:
        c.remove(force=True)


async def test_broken_dockerfile_raises_with_log_tail(backend):
    task = load_task(fixture_task("broken-dockerfile"))
    with pytest.raises(ImageBuildFailed) as exc:
        await backend.create(task, trial_id="broken")
    assert not isinstance(exc.value, ImageBuildTimeout) and exc.value.retryable is False
    assert "broken-dockerfile-marker: about to fail" in exc.value.log_tail
    assert "step one ok" in exc.value.log_tail
    assert "non-zero code: 7" in str(exc.value)


async def test_build_timeout(backend):
    task = load_task(fixture_task("slow-build"))
    t0 = time.monotonic()
    with pytest.raises(ImageBuildTimeout) as exc:
        await backend.ensure_image(task)
    assert exc.value.retryable and time.monotonic() - t0 < 30
    assert "slow-build-marker" in exc.value.log_tail


async def test_missing_prebuilt_image_is_unavailable(tmp_path, backend):
    from tests.trialflow.test_tasks import make_task

    task = load_task(
        make_task(
            tmp_path / "pre", '[environment]\ndocker_image = "trialflow-nonexistent:1"\n', dockerfile=None
        )
    )
    with pytest.raises(ImageUnavailable):
        await backend.ensure_image(task)


async def test_reaper_removes_only_old_managed_containers_of_its_scope(docker_client, backend, make_backend):
    task = load_task(EXAMPLES / "create-file")
    leaked = await backend.create(task, trial_id="leak-1")
    await leaked.start()
    other = make_backend()
    bystander = await other.create(task, trial_id="other-scope")
    try:
        assert (await backend.reap(3600)).removed == []  # young: kept
        assert docker_client.containers.get(leaked.id).status == "running"
        # An hour later the same sweep removes it, and never touches another scope.
        report = reap_containers(docker_client, 3600, backend.labels, now=time.time() + 7200)
        assert report.removed == [leaked.id] and report.failed == {}
        with pytest.raises(SandboxLost):
            await backend.attach(leaked.id)
        assert docker_client.containers.get(bystander.id)
        assert (await other.reap(0)).removed == [bystander.id]
    finally:
        await bystander.stop()


def test_resolve_env_templates():
    """Harbor's rules (whole-value templates only; more cases in test_tasks.py)."""
    host = {"A": "1", "EMPTY": ""}
    env = {"x": "${A}", "y": "${B:-dflt}", "e": "${EMPTY:-e}", "w": "pre-${A}", "lit": "$A"}
    assert resolve_env(env, host) == {"x": "1", "y": "dflt", "e": "", "w": "pre-${A}", "lit": "$A"}


async def test_missing_base_image_is_made_once(tmp_path, docker_client, make_backend):
    import asyncio

    from tests.trialflow.test_tasks import make_task

    base = f"trialflow-testbase:{uuid.uuid4().hex[:8]}"
    calls = []

    def make_base(client):
        calls.append(base)
        client.images.get("trialflow-base:bookworm").tag(base)

    be = make_backend(base_images={base: make_base, "broken-base:1": lambda c: 1 / 0})
    tasks = [
        load_task(make_task(tmp_path / f"t{i}", dockerfile=f"FROM {base}\nRUN echo {i} > /n\n"))
        for i in range(2)
    ]
    try:
        infos = await asyncio.gather(*(be.ensure_image(t) for t in tasks))
        assert calls == [base] and all(i.built for i in infos)
        broken = load_task(make_task(tmp_path / "b", dockerfile="FROM broken-base:1\n"))
        with pytest.raises(BaseImageUnavailable, match="ZeroDivisionError|division by zero") as exc:
            await be.ensure_image(broken)
        assert exc.value.retryable
    finally:
        for tag in [base, *(t.image_tag for t in tasks)]:
            with contextlib.suppress(docker.errors.ImageNotFound):
                docker_client.images.remove(tag, force=True)


async def test_exec_timeout_kills_a_detached_descendant(sandbox_for):
    # setsid leaves the process group coreutils' timeout killed; its parentage still shows.
    sb = await sandbox_for(load_task(EXAMPLES / "create-file"))
    res = await sb.exec("setsid sleep 120 & sleep 60", timeout_s=1)
    assert res.timed_out and res.exit_code == 137 and res.duration_s < 10, res
    left = await sb.exec(["sh", "-c", "for p in /proc/[0-9]*; do cat $p/cmdline; echo; done"])
    assert "sleep120" not in left.stdout.replace("\x00", ""), left.stdout


async def test_exec_timeout_does_not_trust_the_sandbox_timeout(sandbox_for):
    # A planted `timeout` that ignores its deadline: the host ends the command anyway.
    sb = await sandbox_for(load_task(EXAMPLES / "create-file"))
    plant = "printf '#!/bin/sh\\nshift 3; exec \"$@\"\\n' > /usr/local/bin/timeout && chmod +x /usr/local/bin/timeout"
    assert (await sb.exec(plant, user="0")).ok
    res = await sb.exec(["sleep", "30"], timeout_s=1)
    assert res.timed_out and res.exit_code == 137 and res.duration_s < 10, res


async def test_exec_returns_when_a_detached_child_holds_the_output_open(make_backend):
    be = make_backend(exec_grace_s=2)
    sb = await be.create(load_task(EXAMPLES / "create-file"), trial_id="detached")
    try:
        await sb.start()
        # A child of a subshell that already ended (reparented to the container's init) in a
        # session of its own: neither a descendant nor in the group the timeout kills; it
        # keeps stdout open.
        res = await sb.exec("(setsid sleep 120 &); sleep 60", timeout_s=1)
        # The engine closes an exec's streams 2 s after its process ended; the grace (2 s
        # here) may run out first ("exec abandoned"): either way the exec returns.
        assert res.timed_out and res.exit_code == 137, res
        assert 1 <= res.duration_s < 15
        # The sandbox stays usable.
        assert (await sb.exec("echo alive", timeout_s=10)).stdout == "alive\n"
    finally:
        await sb.stop()
