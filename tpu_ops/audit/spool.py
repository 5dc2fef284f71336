"""A local JSONL spool for audit events while S3 is unreachable, drained in order later.

Spooled events are *unsealed* (no seq, no prev_hash): a seq is claimed only when the event reaches
S3, so whatever other writers did meanwhile, the chain in S3 never has a gap or a fork. Every
process sharing the spool file takes an exclusive ``flock`` while it appends or drains.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any


class Spool:
    """Events waiting for S3, one JSON object per line, oldest first."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @contextmanager
    def _locked(self) -> Iterator[IO[str]]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a+", encoding="utf-8") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield fh
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def append(self, entry: dict[str, Any]) -> None:
        """Add ``entry`` at the end (fsynced: an audit event must survive a crash of this process)."""
        with self._locked() as fh:
            fh.write(json.dumps(entry, sort_keys=True) + "\n")
            fh.flush()
            os.fsync(fh.fileno())

    def pending(self) -> int:
        """How many entries wait."""
        if not self.path.exists():
            return 0
        with self._locked() as fh:
            fh.seek(0)
            return sum(1 for line in fh if line.strip())

    def drain(self, send: Callable[[dict[str, Any]], Any]) -> int:
        """Send entries oldest first; stop at the first that fails (it and the rest stay). Returns how many went.

        The exception of the failed ``send`` propagates after the rest is written back.
        """
        if not self.path.exists():
            return 0
        with self._locked() as fh:
            fh.seek(0)
            entries = [json.loads(line) for line in fh if line.strip()]
            done = 0
            try:
                for entry in entries:
                    send(entry)
                    done += 1
            finally:
                if done:
                    fh.seek(0)
                    fh.truncate()
                    fh.writelines(json.dumps(e, sort_keys=True) + "\n" for e in entries[done:])
                    fh.flush()
                    os.fsync(fh.fileno())
            return done
