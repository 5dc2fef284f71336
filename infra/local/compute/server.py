"""Serve the fake Compute Engine on 127.0.0.1 (a free port) in a thread, with a ticker driving time."""

from __future__ import annotations

from typing import Self

from infra.local.compute.models import ComputeBackend
from infra.local.compute.responses import ComputeResponses, LogsProvider
from infra.local.core.oauth import TokenAuthority
from infra.local.core.server import LoopbackServer


class ComputeServer(LoopbackServer):
    """``start()`` binds 127.0.0.1:``port`` (0 = any free port); ``url`` has no trailing slash and is
    what google-cloud-compute takes as ``api_endpoint``. Once started, every link the fake returns
    (``selfLink``, ``targetLink``, ...) points at this server, never at Google."""

    name = "fake-compute"

    def __init__(
        self,
        backend: ComputeBackend | None = None,
        port: int = 0,
        tick_s: float = 0.02,
        logs: LogsProvider | None = None,
        auth: TokenAuthority | None = None,
    ) -> None:
        self.backend = backend or ComputeBackend()
        app = ComputeResponses(self.backend, logs)
        super().__init__(app, port, tick=self.backend.tick, tick_s=tick_s, auth=auth)

    def start(self) -> Self:
        super().start()
        self.backend.link_base = f"{self.url}/compute/v1/"
        return self
