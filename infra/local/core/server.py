"""Serve a fake's WSGI app on 127.0.0.1 (a free port) in a thread, with an optional ticker."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Self

from werkzeug.serving import BaseWSGIServer, WSGIRequestHandler, make_server

if TYPE_CHECKING:
    from infra.local.core.oauth import TokenAuthority


class QuietHandler(WSGIRequestHandler):
    def log_request(self, *args: object, **kwargs: object) -> None:  # no access log on stderr
        pass


class LoopbackServer:
    """``start()`` binds 127.0.0.1:``port`` (0 = any free port); ``url`` has no trailing slash.

    ``tick`` (if given) is called every ``tick_s`` seconds, so time-driven transitions (latency,
    deadlines, grace periods) happen even when nobody polls. ``auth`` (a ``JsonApp``'s) makes the
    fake refuse requests without a token that authority issued; without it the fake is open.
    """

    name = "fake"

    def __init__(
        self,
        app: Callable[..., Any],
        port: int = 0,
        tick: Callable[[], None] | None = None,
        tick_s: float = 0.02,
        auth: TokenAuthority | None = None,
    ) -> None:
        self.app = app
        if auth is not None:
            app.auth, app.fake_name = auth, self.name  # type: ignore[attr-defined]
        self._port = port
        self._tick = tick
        self._tick_s = tick_s
        self._server: BaseWSGIServer | None = None
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()
        self.url = ""

    @property
    def port(self) -> int:
        assert self._server is not None, "call start() first"
        return int(self._server.server_port)

    def start(self) -> Self:
        self._server = make_server("127.0.0.1", self._port, self.app, threaded=True, request_handler=QuietHandler)
        self.url = f"http://127.0.0.1:{self.port}"
        self._stop.clear()
        self._threads = [threading.Thread(target=self._serve, name=f"{self.name}-http", daemon=True)]
        if self._tick is not None:
            self._threads.append(threading.Thread(target=self._ticker, name=f"{self.name}-tick", daemon=True))
        for t in self._threads:
            t.start()
        return self

    def _serve(self) -> None:
        assert self._server is not None
        self._server.serve_forever(poll_interval=0.05)  # shutdown() waits up to one poll interval

    def _ticker(self) -> None:
        assert self._tick is not None
        while not self._stop.wait(self._tick_s):
            self._tick()

    def stop(self) -> None:
        self._stop.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        for t in self._threads:
            t.join(timeout=5)
        self._threads = []

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
