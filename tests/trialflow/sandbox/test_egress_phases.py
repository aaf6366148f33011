"""The egress proxy across phases, on a host listener (the sandbox side needs no engine
here): a policy change ends what the old policy opened."""

import asyncio
import socket

from trialflow.sandbox.network import NetworkPolicy


async def test_a_policy_change_ends_the_tunnels_the_old_policy_opened():
    """A verifier phase's tunnel (opened under its policy) does not outlive the switch to the
    next phase's policy: `set_policy` closes it, and the new policy decides every later request.
    A real EgressProxy on a host listener (the sandbox side needs no engine here)."""
    from trialflow.sandbox.egress import EgressProxy

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(100):
            writer.write(data)
            await writer.drain()

    upstream = await asyncio.start_server(echo, "127.0.0.2", 0)
    target = f"127.0.0.2:{upstream.sockets[0].getsockname()[1]}"
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    listener.setblocking(False)
    verifier = NetworkPolicy("allowlist", ("127.0.0.2",))
    proxy = EgressProxy(verifier, sandbox="host")
    host, port = (await proxy.start(listener)).removeprefix("http://").split(":")

    async def tunnel() -> tuple[asyncio.StreamReader, asyncio.StreamWriter, bytes]:
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(f"CONNECT {target} HTTP/1.1\r\n\r\n".encode())
        return reader, writer, await reader.readuntil(b"\r\n\r\n")

    try:
        reader, writer, head = await tunnel()
        assert head.startswith(b"HTTP/1.1 200")
        writer.write(b"ping")
        assert await reader.readexactly(4) == b"ping"
        proxy.set_policy(verifier)  # the same policy: nothing ends
        writer.write(b"pong")
        assert await reader.readexactly(4) == b"pong"
        proxy.set_policy(NetworkPolicy("no-network"))
        assert await asyncio.wait_for(reader.read(), 5) == b""  # the open tunnel is closed
        writer.close()
        reader, writer, head = await tunnel()
        assert head.startswith(b"HTTP/1.1 403")  # and the new policy refuses a new one
        writer.close()
        assert [d.allowed for d in proxy.log] == [True, False]
    finally:
        await proxy.close()
        upstream.close()
