"""Serve the fake STS on 127.0.0.1 (a free port) in a thread."""

from __future__ import annotations

from infra.local.core.oauth import TokenAuthority
from infra.local.core.server import LoopbackServer
from infra.local.sts.models import StsBackend
from infra.local.sts.responses import StsResponses


class StsServer(LoopbackServer):
    """``start()`` binds 127.0.0.1:``port`` (0 = any free port); ``url`` has no trailing slash."""

    name = "fake-sts"

    def __init__(self, backend: StsBackend | None = None, port: int = 0, auth: TokenAuthority | None = None) -> None:
        self.backend = backend or StsBackend()
        super().__init__(StsResponses(self.backend), port, auth=auth)

    def stop(self) -> None:
        self.backend.stall(False)  # let held workers finish rather than hang a daemon thread
        super().stop()
