"""The egress proxy of the allowlist and public network modes: an HTTP proxy served from
the worker's event loop on a listener inside the sandbox (`Sandbox.listen_loopback`).

It understands the two requests proxy clients send (pip, curl, npm, apt with
HTTP(S)_PROXY): ``CONNECT host:port`` (answered ``200`` then tunnelled byte for byte: TLS
stays end to end) and an absolute-form request ``GET http://host[:port]/path`` (the head
is sent on as is, then bytes are relayed both ways). Each target is checked against the
phase's `NetworkPolicy` after resolving it on the worker (every address must pass; a
name, listed or not, only to global addresses that are not the worker's own), and the
checked address is the one dialled (the name is never resolved twice: DNS rebinding);
anything else is answered ``403`` (policy), ``400`` (not a proxy request) or ``502``
(unreachable) and closed. Every decision is logged; `EgressProxy.log` keeps them for the
trial's logs. The policy can change between phases (`set_policy`, e.g. the verifier's);
a change ends the connections open under the old one.

Limits (`EgressLimits`), so one sandbox cannot take the worker's file descriptors (each
tunnel holds two: the sandbox's side and the upstream's): at most `max_connections`
connections per sandbox (past them accepting pauses: the next waits in the kernel's
backlog until one closes; `proxy.limits.serve_paused`); a request
head must arrive within `header_timeout_s`; a tunnel with no byte moving either way for
`idle_timeout_s` is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

from proxy.limits import serve_paused
from trialflow.sandbox.base import Sandbox
from trialflow.sandbox.network import Address, NetworkPolicy

log = logging.getLogger(__name__)

MAX_HEAD = 64 * 1024


@dataclass(frozen=True)
class EgressLimits:
    """Per sandbox (module docstring). Defaults: 64 connections (pip opens up to ~10,
    npm ~16), a head within 10 s, a tunnel idle for 120 s closed (a package download
    moves bytes all the time)."""

    max_connections: int = 64
    header_timeout_s: float = 10.0
    idle_timeout_s: float = 120.0


@dataclass(frozen=True)
class EgressDecision:
    method: str
    host: str
    port: int
    allowed: bool
    reason: str


async def resolve(host: str, port: int) -> list[Address]:
    """Every address `host` resolves to on the worker (an IP literal: itself)."""
    name = host.strip("[]")
    with contextlib.suppress(ValueError):
        return [ipaddress.ip_address(name)]
    infos = await asyncio.get_running_loop().getaddrinfo(name, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(ipaddress.ip_address(info[4][0]) for info in infos))


def own_address(address: Address) -> bool:
    """Whether `address` is one of the worker's own (its interfaces, in the worker's network
    namespace, where the egress proxy runs): the kernel lets a socket bind only to those.
    A service bound to 0.0.0.0 answers on every one of them, global ones included."""
    family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((str(address), 0))
        except OSError:
            return False
    return True


def parse_target(method: str, target: str) -> tuple[str, int] | None:
    """(host, port) of a proxy request's target; None when it is not one."""
    if method == "CONNECT":
        host, sep, port = target.rpartition(":")
        if not sep or not port.isdigit() or not host:
            return None
        return host.strip("[]"), int(port)
    parts = urlsplit(target)
    if parts.scheme != "http" or not parts.hostname:
        return None
    try:
        return parts.hostname, parts.port or 80
    except ValueError:
        return None


class EgressProxy:
    def __init__(
        self,
        policy: NetworkPolicy,
        *,
        sandbox: str,
        connect_timeout_s: float = 10.0,
        limits: EgressLimits | None = None,
    ) -> None:
        self.policy = policy
        self.sandbox = sandbox
        self.connect_timeout_s = connect_timeout_s
        self.limits = limits or EgressLimits()
        self.log: list[EgressDecision] = []
        self._accepting: asyncio.Task[None] | None = None
        self._sock: socket.socket | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._ended: set[asyncio.Task[None]] = set()  # cancelled by `set_policy`: end quietly
        self.port = 0

    def set_policy(self, policy: NetworkPolicy) -> None:
        """Switch to `policy` for every later request. A different policy also ends every
        connection open now (tunnels included): what a phase allowed is not kept into the next
        (a tunnel a verifier's process opened under ``public`` into an agent's no-network)."""
        if policy != self.policy:
            for task in list(self._tasks):
                self._ended.add(task)
                task.cancel()
        self.policy = policy

    async def start(self, sock: socket.socket) -> str:
        """Serve on `sock` (a listener inside the sandbox); returns the proxy URL for the
        sandbox's HTTP(S)_PROXY."""

        def stream() -> asyncio.Protocol:  # what asyncio.start_server makes per connection
            return asyncio.StreamReaderProtocol(asyncio.StreamReader(limit=MAX_HEAD), self._client)

        # At the cap, accepting pauses: a flood waits in the kernel's backlog, costing the
        # worker neither descriptors nor event-loop time (proxy.limits.serve_paused).
        self._sock = sock
        self._accepting = await serve_paused(sock, stream, self.limits.max_connections)
        self.port = sock.getsockname()[1]
        return f"http://127.0.0.1:{self.port}"

    async def close(self) -> None:
        if self._accepting is not None:
            self._accepting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._accepting
            self._accepting = None
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(BaseException):
                await task

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self._handle(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
            pass
        except asyncio.CancelledError:
            if task not in self._ended:
                raise
        finally:
            self._tasks.discard(task)
            self._ended.discard(task)
            writer.close()

    async def _answer(self, writer: asyncio.StreamWriter, status: str) -> None:
        writer.write(f"HTTP/1.1 {status}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".encode())
        await writer.drain()

    def _decide(self, method: str, host: str, port: int, allowed: bool, reason: str) -> None:
        decision = EgressDecision(method, host, port, allowed, reason)
        self.log.append(decision)
        log.info(
            "egress %s %s %s:%d from %s (%s, %s)",
            "ALLOW" if allowed else "DENY",
            method,
            host,
            port,
            self.sandbox,
            self.policy.mode,
            reason,
        )

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        async with asyncio.timeout(self.limits.header_timeout_s):  # a slow head holds a slot
            head = await reader.readuntil(b"\r\n\r\n")
        if len(head) > MAX_HEAD:
            return await self._answer(writer, "431 Request Header Fields Too Large")
        request_line = head.split(b"\r\n", 1)[0].decode("latin-1")
        parts = request_line.split(" ")
        target = parse_target(parts[0], parts[1]) if len(parts) == 3 else None
        if target is None:
            return await self._answer(writer, "400 Bad Request")
        method, (host, port) = parts[0], target
        try:
            addresses = await resolve(host, port)
        except OSError as exc:
            self._decide(method, host, port, False, f"does not resolve: {exc}")
            return await self._answer(writer, "502 Bad Gateway")
        if not self.policy.allows(host, addresses, own_address):
            self._decide(method, host, port, False, f"not allowed ({', '.join(map(str, addresses))})")
            return await self._answer(writer, "403 Forbidden")
        try:
            # Connect to the address that was checked, never re-resolve the name.
            up_reader, up_writer = await asyncio.wait_for(
                asyncio.open_connection(str(addresses[0]), port), self.connect_timeout_s
            )
        except (OSError, TimeoutError) as exc:
            self._decide(method, host, port, False, f"unreachable: {exc}")
            return await self._answer(writer, "502 Bad Gateway")
        self._decide(method, host, port, True, str(addresses[0]))
        try:
            if method == "CONNECT":
                writer.write(b"HTTP/1.1 200 Connection Established\r\n\r\n")
                await writer.drain()
            else:
                up_writer.write(head)
            moved = _Activity()
            idle = self.limits.idle_timeout_s
            await asyncio.gather(_pipe(reader, up_writer, moved, idle), _pipe(up_reader, writer, moved, idle))
        finally:
            up_writer.close()


class _Activity:
    """When a tunnel last moved a byte, either way (shared by its two pipes)."""

    def __init__(self) -> None:
        self.last = time.monotonic()

    def idle_for(self) -> float:
        return time.monotonic() - self.last


async def _pipe(
    src: asyncio.StreamReader, dst: asyncio.StreamWriter, moved: _Activity, idle_s: float
) -> None:
    """Copy `src` to `dst` until EOF, or until neither direction moved for `idle_s` (then
    both ends are closed: the other pipe ends too)."""
    try:
        while True:
            try:
                data = await asyncio.wait_for(src.read(65536), max(idle_s - moved.idle_for(), 0.01))
            except TimeoutError:
                if moved.idle_for() < idle_s:
                    continue  # the other direction moved meanwhile
                dst.close()
                return
            if not data:
                break
            moved.last = time.monotonic()
            dst.write(data)
            await dst.drain()
    except ConnectionError:
        pass
    finally:
        with contextlib.suppress(OSError, RuntimeError):
            if dst.can_write_eof():
                dst.write_eof()


def proxy_env(url: str, local_names: tuple[str, ...] = ()) -> dict[str, str]:
    """The environment that points proxy-aware clients at the egress proxy (both spellings:
    curl reads lower case, pip and npm either); loopback (the session forwarder) and the
    sandbox's `local_names` (a compose task's services, on that loopback) go direct."""
    env = {}
    for name in ("http_proxy", "https_proxy", "all_proxy"):
        env[name] = env[name.upper()] = url
    env["no_proxy"] = env["NO_PROXY"] = ",".join(["127.0.0.1", "localhost", *local_names])
    return env


class Egresses:
    """The egress proxies of one worker's sandboxes, by sandbox id: opened when a phase
    whose policy needs one starts (`env_for`), switched to each phase's policy, closed with
    the sandbox (`close`). Shared by the set-up, scaffold, verify and teardown activities
    of the worker (they all run on the sandbox's host)."""

    def __init__(self, limits: EgressLimits | None = None) -> None:
        self.limits = limits or EgressLimits()
        self._proxies: dict[str, EgressProxy] = {}
        self._urls: dict[str, str] = {}

    async def env_for(self, sandbox: Sandbox, policy: NetworkPolicy) -> dict[str, str]:
        """The proxy environment for a phase with `policy` ({} for no-network: any proxy
        of an earlier phase then refuses everything)."""
        existing = self._proxies.get(sandbox.id)
        if existing is not None:
            existing.set_policy(policy)
        if not policy.egress:
            return {}
        if existing is None:
            if policy.mode == "public":  # the verifier's default: info (set-up warns for an agent's)
                log.info("sandbox %s: network mode public (egress to global addresses)", sandbox.id)
            existing = self._proxies[sandbox.id] = EgressProxy(policy, sandbox=sandbox.id, limits=self.limits)
            self._urls[sandbox.id] = await existing.start(await sandbox.listen_loopback())
        return proxy_env(self._urls[sandbox.id], sandbox.local_names)

    def decisions(self, sandbox_id: str) -> list[EgressDecision]:
        proxy = self._proxies.get(sandbox_id)
        return list(proxy.log) if proxy else []

    async def close(self, sandbox_id: str) -> None:
        proxy = self._proxies.pop(sandbox_id, None)
        self._urls.pop(sandbox_id, None)
        if proxy is not None:
            await proxy.close()

    async def close_all(self) -> None:
        for sandbox_id in list(self._proxies):
            await self.close(sandbox_id)

    def __len__(self) -> int:
        return len(self._proxies)
