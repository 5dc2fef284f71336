"""moto in server mode (S3, SageMaker, STS and the rest) on a free loopback port, in a thread.

In-process is the fast choice (no second interpreter importing moto). moto keeps its state in
process-wide backends: the first server started in a process resets them; servers started while
another is live share that state (one live stack per process is the intended use). Our fixes to
moto's costs that grow with data size (``moto_patches``) are applied before it serves.
"""

from __future__ import annotations

from collections.abc import Iterable

from infra.local._proc import LOOPBACK, http_call


class MotoServer:
    """moto's ``ThreadedMotoServer`` bound to 127.0.0.1 on a port the OS picks."""

    live = 0  # servers running in this process (they share moto's global backends)

    def __init__(self) -> None:
        from moto.server import ThreadedMotoServer

        from infra.local import moto_patches

        moto_patches.apply()  # S3 costs that grow with data size (see moto_patches, README)

        self._server = ThreadedMotoServer(ip_address=LOOPBACK, port=0, verbose=False)
        self.port = 0
        self.url = ""

    def start(self) -> None:
        self._server.start()
        _, self.port = self._server.get_host_and_port()
        self.url = f"http://{LOOPBACK}:{self.port}"
        if MotoServer.live == 0:
            self.reset()  # forget what an earlier stack in this process left behind
        MotoServer.live += 1

    def reset(self) -> None:
        """Forget every AWS resource (moto's own reset endpoint)."""
        http_call(f"{self.url}/moto-api/reset", "POST", b"")

    def put_objects(self, bucket: str, objects: Iterable[tuple[str, bytes]]) -> int:
        """Store objects straight into moto's in-process backend (seeding at scale: ~30 us each
        instead of an HTTP PUT's milliseconds). Only for a server in this process; returns how many."""
        from moto.core import DEFAULT_ACCOUNT_ID  # type: ignore[attr-defined]
        from moto.s3.models import s3_backends

        backend = s3_backends[DEFAULT_ACCOUNT_ID]["aws"]
        n = 0
        for key, body in objects:
            backend.put_object(bucket, key, body, disable_notification=True)
            n += 1
        return n

    def stop(self) -> None:
        if self.url:
            self._server.stop()
            self.url = ""
            MotoServer.live -= 1
