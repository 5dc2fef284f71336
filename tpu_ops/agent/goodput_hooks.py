"""The agent's part of goodput accounting (stdlib only, Python 3.10): the trainer's own step records.

A trainer may append one JSON line per event to the file named by ``TPU_OPS_STEP_LOG``:
``{"kind": "step"|"save"|"restore"|"data"|"prep", "step": N, "start": t0, "end": t1}`` (wall-clock
seconds). Worker 0's agent reads the new lines at every heartbeat and carries them all, as
``timeline: [[kind, step, start, end], ...]``, in its heartbeat (a field added beside the others);
the supervisor keeps them in the run's state and derives productive time from them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

STEP_LOG_ENV = "TPU_OPS_STEP_LOG"
KINDS = frozenset({"step", "save", "restore", "data", "prep", "init"})
MAX_RECORDS = 200_000  # a heartbeat stays a few MB at most


class StepTimeline:
    """Incrementally reads a trainer's step log; worker 0's records go into its heartbeats."""

    def __init__(self, workdir: Path, worker: int) -> None:
        self.path = workdir / "steps.jsonl"
        self.worker = worker
        self.records: list[list[Any]] = []
        self._offset = 0
        self._partial = b""
        self.path.unlink(missing_ok=True)  # a fresh incarnation on a reused disk starts a fresh log

    def env(self) -> dict[str, str]:
        """What the trainer's environment gets."""
        return {STEP_LOG_ENV: str(self.path)}

    def read(self) -> None:
        """Take the lines appended since the last read (a half-written last line waits)."""
        try:
            with self.path.open("rb") as f:
                f.seek(self._offset)
                chunk = f.read()
        except FileNotFoundError:
            return
        self._offset += len(chunk)
        data = self._partial + chunk
        *lines, self._partial = data.split(b"\n")
        for line in lines:
            try:
                r = json.loads(line)
                kind, start, end = str(r["kind"]), float(r["start"]), float(r["end"])
                step = None if r.get("step") is None else int(r["step"])
            except (ValueError, KeyError, TypeError):
                continue  # not ours to judge: a malformed line is skipped
            if kind in KINDS and end >= start and len(self.records) < MAX_RECORDS:
                self.records.append([kind, step, start, end])

    def heartbeat_fields(self) -> dict[str, Any]:
        """Fields added to this worker's heartbeat (only worker 0 carries the timeline)."""
        self.read()
        return {"timeline": self.records} if self.worker == 0 else {}


def record(kind: str, step: int | None, start: float, end: float) -> None:
    """For trainers: append one record to ``TPU_OPS_STEP_LOG`` (no-op when it is not set)."""
    path = os.environ.get(STEP_LOG_ENV)
    if not path:
        return
    line = json.dumps({"kind": kind, "step": step, "start": start, "end": end}) + "\n"
    with open(path, "a", encoding="utf-8") as f:
        f.write(line)
