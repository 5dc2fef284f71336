"""Small process and port helpers shared by the emulator launchers.

Everything binds 127.0.0.1 only; child processes get their own process group so stopping the
stack can signal a whole tree (a startup script's children included) and nothing outlives it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import urllib.error
import urllib.request
from collections.abc import Callable

from tpu_ops.polling import poll

LOOPBACK = "127.0.0.1"


def free_port() -> int:
    """A port that was free on loopback a moment ago (the caller binds it right away)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


def wait_until(pred: Callable[[], bool], timeout: float, interval: float = 0.02, what: str = "") -> None:
    """Poll ``pred`` every ``interval`` s until it is true (tpu-ops' one polling helper); raise
    ``TimeoutError`` naming ``what`` after ``timeout`` s."""
    poll(lambda: True if pred() else None, timeout_s=timeout, interval_s=interval, max_interval_s=interval,
         what=what or repr(pred))  # fmt: skip


def http_ok(url: str, timeout: float = 1.0) -> bool:
    """True when ``url`` answers with any HTTP status below 500."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 - loopback only
            return int(resp.status) < 500
    except urllib.error.HTTPError as e:
        return e.code < 500
    except OSError:
        return False


def http_call(url: str, method: str = "GET", body: bytes | None = None, timeout: float = 10.0) -> bytes:
    """A plain HTTP request to a loopback emulator; returns the body, raises on HTTP errors."""
    headers = {"Content-Type": "application/json"} if body is not None else {}
    req = urllib.request.Request(url, data=body, method=method, headers=headers)  # noqa: S310 - loopback
    with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - loopback only
        return bytes(resp.read())


def kill_group(proc: subprocess.Popen[bytes], grace: float) -> None:
    """SIGTERM the process group of ``proc``, then SIGKILL it after ``grace`` seconds."""
    if proc.poll() is not None:
        _kill_leftovers(proc.pid)
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace)
    _kill_leftovers(proc.pid)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)


def _kill_leftovers(pgid: int) -> None:
    # The leader may be gone while its children (same group) still run: kill the group regardless.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
