"""Serve the fake TPU API on 127.0.0.1 (a free port) in a thread, with a ticker driving time."""

from __future__ import annotations

from infra.local.core.oauth import TokenAuthority
from infra.local.core.server import LoopbackServer, QuietHandler
from infra.local.tpu.models import TpuBackend
from infra.local.tpu.responses import LogsProvider, TpuResponses

_QuietHandler = QuietHandler  # the old private name, for imports written before the shared core


class TpuServer(LoopbackServer):
    """``start()`` binds 127.0.0.1:``port`` (0 = any free port); ``url`` has no trailing slash."""

    name = "fake-tpu"

    def __init__(
        self,
        backend: TpuBackend | None = None,
        port: int = 0,
        tick_s: float = 0.02,
        logs: LogsProvider | None = None,
        auth: TokenAuthority | None = None,
    ) -> None:
        self.backend = backend or TpuBackend()
        super().__init__(TpuResponses(self.backend, logs), port, tick=self.backend.tick, tick_s=tick_s, auth=auth)
