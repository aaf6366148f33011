"""Network isolation and process stopping against the real engine: a sandbox reaches only
the listener the worker serves into its namespace; stop_processes leaves nothing running."""

import asyncio
import os
import socket

import pytest

from tests.trialflow.conftest import EXAMPLES
from trialflow.sandbox.netns import listen_in_netns, same_netns
from trialflow.tasks import load_task

pytestmark = pytest.mark.docker

CONNECT = """
import socket, sys
s = socket.socket(); s.settimeout(3)
try:
    s.connect(("127.0.0.1", int(sys.argv[1]))); s.sendall(b"ping"); print("got", s.recv(16).decode())
except OSError as e:
    print("refused", type(e).__name__)
"""


async def _serve_pong(sock: socket.socket) -> asyncio.AbstractServer:
    async def pong(reader, writer):
        await reader.read(4)
        writer.write(b"pong")
        await writer.drain()
        writer.close()

    return await asyncio.start_server(pong, sock=sock)


async def test_sandbox_reaches_its_listener_and_not_the_host(sandbox_for):
    sb = await sandbox_for(load_task(EXAMPLES / "create-file"))
    inspect = sb._backend.client.api.inspect_container(sb.container_id)
    assert inspect["HostConfig"]["NetworkMode"] == "none"
    assert not same_netns(inspect["State"]["Pid"])
    inside = await sb.listen_loopback()
    host = socket.socket()
    host.bind(("127.0.0.1", 0))
    host.listen(4)
    host.setblocking(False)
    servers = [await _serve_pong(inside), await _serve_pong(host)]
    try:
        port_in, port_host = inside.getsockname()[1], host.getsockname()[1]
        ok = await sb.exec(["python3", "-c", CONNECT, str(port_in)], timeout_s=30)
        assert ok.stdout.strip() == "got pong", ok
        # The host's loopback listener with the same address is not reachable from inside...
        if port_host != port_in:
            blocked = await sb.exec(["python3", "-c", CONNECT, str(port_host)], timeout_s=30)
            assert blocked.stdout.startswith("refused"), blocked
        # ... and no interface but lo exists: no route anywhere.
        links = await sb.exec("ls /sys/class/net; cat /proc/net/route | wc -l")
        assert links.stdout.split() == ["lo", "1"], links
        # The in-sandbox listener is not on the host's loopback.
        with socket.socket() as probe:
            probe.settimeout(1)
            assert probe.connect_ex(("127.0.0.1", port_in)) != 0 or port_in == port_host
    finally:
        for server in servers:
            server.close()
            await server.wait_closed()


async def _until_running(sb, cmdlines: list[str], also: str, timeout_s: float = 30) -> None:
    """Until a process with each of ``cmdlines`` runs in ``sb`` and ``also`` succeeds there."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        ps = await sb.exec(
            f"{also} && for p in /proc/[0-9]*; do cat $p/cmdline 2>/dev/null | tr '\\0' ' '; echo; done"
        )
        if ps.ok and all(c in ps.stdout for c in cmdlines):
            return
        assert asyncio.get_running_loop().time() < deadline, f"not all of {cmdlines} started: {ps.stdout}"
        await asyncio.sleep(0.05)


async def test_stop_processes_kills_daemons_and_keeps_the_sandbox(sandbox_for):
    sb = await sandbox_for(load_task(EXAMPLES / "create-file"))
    started = await sb.exec(
        "setsid nohup bash -c 'while :; do echo 1 > /tmp/reward; sleep 0.05; done' >/dev/null 2>&1 & "
        "(sleep 1000 &) ; nohup sleep 999 >/dev/null 2>&1 & echo ok",
        timeout_s=30,
    )
    assert started.ok
    await _until_running(sb, ["sleep 1000", "sleep 999", "while :"], also="test -e /tmp/reward")
    killed = await sb.stop_processes()
    assert killed >= 3
    await sb.exec("rm -f /tmp/reward", user="0")
    await asyncio.sleep(0.3)  # the subject: a surviving loop would write /tmp/reward again by now
    after = await sb.exec(
        "ls /tmp; for p in /proc/[0-9]*; do cat $p/cmdline 2>/dev/null | tr '\\0' ' '; echo; done"
    )
    assert "reward" not in after.stdout, after.stdout
    assert "sleep 1000" not in after.stdout and "sleep 999" not in after.stdout
    assert (await sb.exec("true")).ok  # the sandbox itself is alive


async def test_listen_in_netns_errors_are_oserrors():
    with pytest.raises(OSError):
        listen_in_netns(2**22 + 12345)
    assert same_netns(os.getpid())


async def test_the_images_healthcheck_never_runs_in_a_sandbox(sandbox_for, tmp_path):
    """The engine would exec an image's HEALTHCHECK in the sandbox on its own schedule, with
    whatever the agent made of its files, also while the verifier has network: disabled."""
    import shutil

    root = tmp_path / "healthcheck-image"
    shutil.copytree(EXAMPLES / "create-file", root)
    dockerfile = root / "environment" / "Dockerfile"
    dockerfile.write_text(
        dockerfile.read_text() + "HEALTHCHECK --interval=1s CMD touch /tmp/healthcheck-ran\n"
    )
    sb = await sandbox_for(load_task(root))
    config = sb._backend.client.api.inspect_container(sb.container_id)["Config"]
    assert config["Healthcheck"]["Test"] == ["NONE"]
    await asyncio.sleep(3)  # three intervals of the image's schedule
    ran = await sb.exec(["test", "-e", "/tmp/healthcheck-ran"], timeout_s=30)
    assert ran.exit_code == 1, ran
