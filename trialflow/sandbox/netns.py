"""Listening sockets inside another process's network namespace (Linux; needs CAP_SYS_ADMIN).

`listen_in_netns(pid)` opens a TCP listener on 127.0.0.1 inside the network namespace of
`pid` (a sandbox's init process) and hands it back to the caller, who serves it from its
own event loop: a socket keeps the namespace it was created in, so connections to it come
only from processes in that namespace, and whatever serves them runs outside the sandbox.
This is how a sandbox started with no network at all reaches exactly one endpoint, its
proxy session (docs/design.md, "Sandbox network"). No interface, route, address or
namespace is created; nothing is left behind when the socket is closed.

`setns(2)` changes the namespace of the calling *thread* only, so the switch happens on a
short-lived helper thread of its own, which switches back before it ends (and would take
the foreign namespace with it if it could not). Cost: ~1-2 ms per listener.
"""

from __future__ import annotations

import ctypes
import os
import socket
import threading

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns(CLONE_NEWNET): {os.strerror(err)}")


def listen_in_netns(pid: int, *, host: str = "127.0.0.1", port: int = 0, backlog: int = 512) -> socket.socket:
    """A non-blocking listening TCP socket on `host:port` in the network namespace of
    process `pid`. `port=0`: the kernel picks a free port in that namespace (read it from
    `getsockname()`). Raises OSError (no such process, no permission, address in use)."""
    result: dict[str, object] = {}

    def create() -> None:
        own = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        try:
            target = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
            try:
                _setns(target)
            finally:
                os.close(target)
            try:
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                try:
                    sock.bind((host, port))
                    sock.listen(backlog)
                    sock.setblocking(False)
                except BaseException:
                    sock.close()
                    raise
                result["sock"] = sock
            finally:
                _setns(own)  # if this failed the thread ends in the foreign namespace: harmless
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            result["error"] = exc
        finally:
            os.close(own)

    helper = threading.Thread(target=create, name=f"tf-netns-{pid}", daemon=True)
    helper.start()
    helper.join()
    if "error" in result:
        raise result["error"]  # type: ignore[misc]
    return result["sock"]  # type: ignore[return-value]


def same_netns(pid: int) -> bool:
    """True when `pid` shares this process's network namespace (a host-network sandbox)."""
    return os.stat(f"/proc/{pid}/ns/net").st_ino == os.stat("/proc/self/ns/net").st_ino
