"""Ship a trainer's log to GCS as it grows, so ``tpu-ops logs`` can read it from anywhere.

GCS has no append: each shipment is a new object holding the bytes written since the last one,
named by its byte offset (so a reader concatenates a worker's pieces in order) and by when it was
shipped (so a reader interleaves workers). A VM's disk is gone after a preemption; GCS keeps them.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from tpu_ops.agent.gcs import Gcs, GcsError
from tpu_ops.agent.job import RunPaths

MAX_CHUNK = 4 << 20  # a trainer that floods its log ships it in pieces of at most 4 MiB


class LogShipper:
    """The bytes of ``path`` not yet shipped, uploaded on each ``ship()`` (best effort)."""

    def __init__(
        self, gcs: Gcs, paths: RunPaths, incarnation: str, worker: int, path: Path, slice_index: int = 0
    ) -> None:
        self.gcs, self.paths, self.incarnation, self.worker, self.path = gcs, paths, incarnation, worker, path
        self.slice = slice_index
        try:  # a disk that survived (a restart, not a recreate) keeps the last incarnation's log: not ours
            self.offset = path.stat().st_size
        except OSError:
            self.offset = 0

    def ship(self) -> None:
        """Upload what the log gained since the last call; a failure is retried on the next one."""
        try:
            with self.path.open("rb") as f:
                f.seek(self.offset)
                data = f.read(MAX_CHUNK)
        except OSError:
            return  # no log yet
        if not data:
            return
        key = self.paths.log_chunk(self.incarnation, self.worker, self.offset, int(time.time() * 1000), self.slice)
        try:
            self.gcs.write(self.paths.bucket, key, data, "text/plain")
        except GcsError as exc:  # logs must never stop training
            print(f"tpu-ops agent: log not shipped: {exc}", file=sys.stderr, flush=True)
            return
        self.offset += len(data)
