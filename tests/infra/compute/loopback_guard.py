"""A socket guard: while active, any name lookup or connection to a non-loopback address fails
(``OSError``) and is recorded, so a test can assert that no request left 127.0.0.0/8."""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

_LOOPBACK_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost"}


def _loopback(host: Any) -> bool:
    if isinstance(host, bytes):
        host = host.decode()
    if not isinstance(host, str):
        return False
    if host in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return False


@contextmanager
def loopback_only() -> Iterator[list[str]]:
    """Yield the list of blocked attempts (``"getaddrinfo host"``, ``"connect host:port"``)."""
    blocked: list[str] = []
    real_getaddrinfo, real_connect, real_connect_ex = (
        socket.getaddrinfo,
        socket.socket.connect,
        socket.socket.connect_ex,
    )

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        if host is not None and not _loopback(host):
            blocked.append(f"getaddrinfo {host}")
            raise OSError(f"loopback guard: lookup of {host!r} refused")
        return real_getaddrinfo(host, *args, **kwargs)

    def check(sock: socket.socket, address: Any) -> None:
        if sock.family in (socket.AF_INET, socket.AF_INET6) and not _loopback(address[0]):
            blocked.append(f"connect {address[0]}:{address[1]}")
            raise OSError(f"loopback guard: connection to {address!r} refused")

    def connect(sock: socket.socket, address: Any) -> None:
        check(sock, address)
        real_connect(sock, address)

    def connect_ex(sock: socket.socket, address: Any) -> int:
        check(sock, address)
        return real_connect_ex(sock, address)

    socket.getaddrinfo = getaddrinfo  # type: ignore[assignment]
    socket.socket.connect = connect  # type: ignore[method-assign]
    socket.socket.connect_ex = connect_ex  # type: ignore[method-assign]
    try:
        yield blocked
    finally:
        socket.getaddrinfo = real_getaddrinfo
        socket.socket.connect = real_connect  # type: ignore[method-assign]
        socket.socket.connect_ex = real_connect_ex  # type: ignore[method-assign]
