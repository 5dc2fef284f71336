"""Serve the fake TPU API on 127.0.0.1 (a free port) in a thread, with a ticker driving time."""

from __future__ import annotations

import threading

from werkzeug.serving import BaseWSGIServer, WSGIRequestHandler, make_server

from infra.local.tpu.models import TpuBackend
from infra.local.tpu.responses import LogsProvider, TpuResponses


class _QuietHandler(WSGIRequestHandler):
    def log_request(self, *args: object, **kwargs: object) -> None:  # no access log on stderr
        pass


class TpuServer:
    """``start()`` binds 127.0.0.1:``port`` (0 = any free port); ``url`` has no trailing slash."""

    def __init__(
        self, backend: TpuBackend | None = None, port: int = 0, tick_s: float = 0.02, logs: LogsProvider | None = None
    ) -> None:
        self.backend = backend or TpuBackend()
        self.app = TpuResponses(self.backend, logs)
        self._port = port
        self._tick_s = tick_s
        self._server: BaseWSGIServer | None = None
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()
        self.url = ""

    @property
    def port(self) -> int:
        assert self._server is not None, "call start() first"
        return int(self._server.server_port)

    def start(self) -> TpuServer:
        self._server = make_server("127.0.0.1", self._port, self.app, threaded=True, request_handler=_QuietHandler)
        self.url = f"http://127.0.0.1:{self.port}"
        self._stop.clear()
        self._threads = [
            threading.Thread(target=self._serve, name="fake-tpu-http", daemon=True),
            threading.Thread(target=self._ticker, name="fake-tpu-tick", daemon=True),
        ]
        for t in self._threads:
            t.start()
        return self

    def _serve(self) -> None:
        assert self._server is not None
        self._server.serve_forever(poll_interval=0.05)  # shutdown() waits up to one poll interval

    def _ticker(self) -> None:
        # Time-driven transitions (latency, queueing deadlines) happen even when nobody polls.
        while not self._stop.wait(self._tick_s):
            self.backend.tick()

    def stop(self) -> None:
        self._stop.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        for t in self._threads:
            t.join(timeout=5)
        self._threads = []

    def __enter__(self) -> TpuServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
