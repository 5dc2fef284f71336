"""moto in server mode (S3, SageMaker, STS and the rest) on a free loopback port, in a thread.

In-process is the fast choice (no second interpreter importing moto). moto keeps its state in
process-wide backends, so the stack resets them on start: one live stack per process.
"""

from __future__ import annotations

from infra.local._proc import LOOPBACK, http_call


class MotoServer:
    """moto's ``ThreadedMotoServer`` bound to 127.0.0.1 on a port the OS picks."""

    def __init__(self) -> None:
        from moto.server import ThreadedMotoServer

        self._server = ThreadedMotoServer(ip_address=LOOPBACK, port=0, verbose=False)
        self.port = 0
        self.url = ""

    def start(self) -> None:
        self._server.start()
        _, self.port = self._server.get_host_and_port()
        self.url = f"http://{LOOPBACK}:{self.port}"
        self.reset()

    def reset(self) -> None:
        """Forget every AWS resource (moto's own reset endpoint)."""
        http_call(f"{self.url}/moto-api/reset", "POST", b"")

    def stop(self) -> None:
        if self.url:
            self._server.stop()
            self.url = ""
