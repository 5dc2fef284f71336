"""Serve the fake STS on 127.0.0.1 (a free port) in a thread."""

from __future__ import annotations

import threading

from werkzeug.serving import BaseWSGIServer, make_server

from infra.local.sts.models import StsBackend
from infra.local.sts.responses import StsResponses
from infra.local.tpu.server import _QuietHandler


class StsServer:
    """``start()`` binds 127.0.0.1:``port`` (0 = any free port); ``url`` has no trailing slash."""

    def __init__(self, backend: StsBackend | None = None, port: int = 0) -> None:
        self.backend = backend or StsBackend()
        self.app = StsResponses(self.backend)
        self._port = port
        self._server: BaseWSGIServer | None = None
        self._thread: threading.Thread | None = None
        self.url = ""

    def start(self) -> StsServer:
        self._server = make_server("127.0.0.1", self._port, self.app, threaded=True, request_handler=_QuietHandler)
        self.url = f"http://127.0.0.1:{self._server.server_port}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name="fake-sts-http", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self.backend.stall(False)  # let held workers finish rather than hang a daemon thread
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> StsServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
