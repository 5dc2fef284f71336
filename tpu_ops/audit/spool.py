"""A local JSONL spool for audit events while S3 is unreachable, drained in order later.

Spooled events are *unsealed* (no seq, no prev_hash): a seq is claimed only when the event reaches
S3, so whatever other writers did meanwhile, the chain in S3 never has a gap or a fork. Every
process sharing the spool file takes an exclusive ``flock`` while it appends or drains.

A process can die mid-append and leave a torn last line. An append never writes onto it (it
starts a new line), and a drain moves any line that is not a whole entry to the quarantine file
beside the spool (``<spool>.quarantine``), verbatim, so the caller can report and audit it. An
entry that fails for a reason other than S3 being unreachable holds back only the later entries
of its own chain (their order matters); other chains drain past it.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any


@dataclass(frozen=True)
class Quarantined:
    """A spool line that was not a whole entry, moved to the quarantine file."""

    line: int
    size: int
    sha256: str


@dataclass
class Drained:
    """What a drain did: entries sent, lines quarantined, chains held back (chain → the error)."""

    sent: int = 0
    quarantined: list[Quarantined] = field(default_factory=list)
    stuck: dict[str, str] = field(default_factory=dict)


def _entry(line: bytes) -> dict[str, Any] | None:
    try:
        entry = json.loads(line)
    except (ValueError, RecursionError):
        return None
    ok = (
        isinstance(entry, dict)
        and isinstance(entry.get("event"), dict)
        and isinstance(entry["event"].get("chain"), str)
    )
    return entry if ok and entry.get("kind") in ("record", "digest") else None


class Spool:
    """Events waiting for S3, one JSON object per line, oldest first."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @property
    def quarantine_path(self) -> Path:
        return self.path.with_name(self.path.name + ".quarantine")

    @contextmanager
    def _locked(self) -> Iterator[IO[bytes]]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a+b") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield fh
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def append(self, entry: dict[str, Any]) -> None:
        """Add ``entry`` at the end (fsynced: an audit event must survive a crash of this process)."""
        with self._locked() as fh:
            self._write(fh, [entry])

    @staticmethod
    def _write(fh: IO[bytes], entries: list[dict[str, Any]]) -> None:
        fh.seek(0, os.SEEK_END)
        if fh.tell():
            fh.seek(-1, os.SEEK_END)
            if fh.read(1) != b"\n":  # a torn line from a crashed append: never glue onto it
                fh.write(b"\n")
        fh.write(b"".join(json.dumps(e, sort_keys=True).encode() + b"\n" for e in entries))
        fh.flush()
        os.fsync(fh.fileno())

    def holds(self, chain: str) -> bool:
        """True if an entry of ``chain`` waits here (its run began: a record of it was kept)."""
        if not self.path.exists():
            return False
        with self._locked() as fh:
            fh.seek(0)
            return any((e := _entry(line)) is not None and e["event"]["chain"] == chain for line in fh if line.strip())

    def pending(self) -> int:
        """How many lines wait (a torn line counts until a drain quarantines it)."""
        if not self.path.exists():
            return 0
        with self._locked() as fh:
            fh.seek(0)
            return sum(1 for line in fh if line.strip())

    def drain(self, send: Callable[[dict[str, Any]], Any], unreachable: Callable[[BaseException], bool]) -> Drained:
        """Send entries oldest first. A line that is not an entry is quarantined. An entry whose ``send``
        fails holds back the rest of its chain; if ``unreachable(error)``, everything stops and the
        error propagates after what is left has been written back.
        """
        out = Drained()
        if not self.path.exists():
            return out
        stopped: BaseException | None = None
        with self._locked() as fh:
            fh.seek(0)
            lines = [line for line in fh.read().split(b"\n") if line.strip()]
            keep: list[dict[str, Any]] = []
            bad: list[bytes] = []
            for n, line in enumerate(lines, 1):
                entry = _entry(line)
                if entry is None:
                    bad.append(line)
                    out.quarantined.append(Quarantined(n, len(line), hashlib.sha256(line).hexdigest()))
                    continue
                chain = entry["event"]["chain"]
                if stopped is not None or chain in out.stuck:
                    keep.append(entry)
                    continue
                try:
                    send(entry)
                    out.sent += 1
                except Exception as exc:
                    keep.append(entry)
                    if unreachable(exc):
                        stopped = exc  # S3 is down: keep the rest as it is
                    else:
                        out.stuck[chain] = f"{type(exc).__name__}: {exc}"
            if bad:
                self._quarantine(bad)
            if out.sent or bad:
                fh.seek(0)
                fh.truncate()
                if keep:
                    self._write(fh, keep)
                else:
                    fh.flush()
                    os.fsync(fh.fileno())
        if stopped is not None:
            raise stopped
        return out

    def _quarantine(self, lines: list[bytes]) -> None:
        with open(self.quarantine_path, "ab") as q:
            q.write(b"".join(line + b"\n" for line in lines))
            q.flush()
            os.fsync(q.fileno())
