"""The trainers' output from every worker, as the agents ship it to ``RUN/_tpu_ops/logs/``, merged.

Each agent uploads what its trainer's log gained since the last heartbeat as one object,
``logs/<incarnation>/worker-<n>/<offset>-<ms>.log``, on slice ``s`` > 0 of a multislice run
``logs/<incarnation>/slice-<s>-worker-<n>/...`` (``tpu_ops.agent.logship``). A reader lists them,
orders them by when they were shipped (then slice, worker, offset: a worker's pieces are shipped in
order), and cuts them into lines labelled ``[w<n>]`` (``[s<s> w<n>]`` in a multislice run); a line
cut between two pieces is held back until its end arrives. ``LogReader.read`` returns only what is
new since its last call, so following a run is calling it again.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Final

from tpu_ops.cloud.translate import google_errors
from tpu_ops.errors import NotFoundError
from tpu_ops.layout import RunLayout

_CHUNK: Final = re.compile(
    r"/(?P<inc>[^/]+)/(?:slice-(?P<slice>\d+)-)?worker-(?P<worker>\d+)/(?P<offset>\d+)-(?P<ms>\d+)\.log$"
)


@dataclass(frozen=True, order=True)
class Chunk:
    """One shipped piece of a worker's log (ordered by when it was shipped)."""

    at_ms: int
    slice: int
    worker: int
    offset: int
    incarnation: str
    key: str


def parse_chunk(key: str) -> Chunk | None:
    """The chunk an object key names, or None for anything else under ``logs/``."""
    m = _CHUNK.search(key)
    if m is None:
        return None
    return Chunk(int(m["ms"]), int(m["slice"] or 0), int(m["worker"]), int(m["offset"]), m["inc"], key)


def incarnation_number(incarnation: str) -> int | None:
    """``3`` for incarnation id ``3-1a2b3c4d``."""
    head = incarnation.split("-", 1)[0]
    return int(head) if head.isdigit() else None


class LogReader:
    """The new lines of a run's trainer logs on each ``read()``: every worker of every slice, or only
    worker ``worker`` (of each slice) and only slice ``slice_index``; ``slices``: the run's slice count."""

    def __init__(
        self, gcs: Any, layout: RunLayout, worker: int | None = None, slice_index: int | None = None, slices: int = 1
    ) -> None:
        self.gcs, self.layout, self.worker, self.slice, self.slices = gcs, layout, worker, slice_index, slices
        self._seen: set[str] = set()
        self._partial: dict[tuple[str, int, int], str] = {}
        self._next: dict[tuple[str, int, int], int] = {}  # the offset each worker's next piece starts at
        self._incarnation: str | None = None

    def _wanted(self, c: Chunk) -> bool:
        return (self.worker is None or c.worker == self.worker) and (self.slice is None or c.slice == self.slice)

    def _label(self, slice_index: int, worker: int) -> str:
        """``[w1]``; ``[s1 w0]`` when the run has several slices (or the piece is not slice 0's)."""
        return f"[s{slice_index} w{worker}]" if self.slices > 1 or slice_index else f"[w{worker}]"

    def _chunks(self) -> list[Chunk]:
        prefix = self.layout.logs
        with google_errors("gcs"):
            blobs = list(self.gcs.list_blobs(prefix.bucket, prefix=prefix.prefix + "/"))
        found = (parse_chunk(b.name) for b in blobs if b.name not in self._seen)
        return sorted(c for c in found if c is not None and self._wanted(c))

    def read(self, final: bool = False) -> list[str]:
        """Lines shipped since the last call, labelled; ``final``: also the unfinished last lines."""
        out: list[str] = []
        for c in self._chunks():
            stream = (c.incarnation, c.slice, c.worker)
            if c.offset > self._next.get(stream, c.offset):
                break  # an earlier piece of this worker is not listed yet: wait for it (keeps the order)
            try:
                with google_errors("gcs"):
                    data = self.gcs.bucket(self.layout.logs.bucket).blob(c.key).download_as_bytes()
            except NotFoundError:
                continue
            self._seen.add(c.key)
            self._next[stream] = c.offset + len(data)
            if c.incarnation != self._incarnation:
                self._incarnation = c.incarnation
                n = incarnation_number(c.incarnation)
                out.append(f"-- slice incarnation {n if n is not None else c.incarnation} --")
            text = self._partial.pop(stream, "") + data.decode("utf-8", errors="replace")
            *lines, rest = text.split("\n")
            out += [f"{self._label(c.slice, c.worker)} {line}" for line in lines]
            if rest:
                self._partial[stream] = rest
        if final:
            ends = sorted(self._partial.items(), key=lambda kv: kv[0][1:])
            out += [f"{self._label(s, w)} {rest}" for (_, s, w), rest in ends]
            self._partial.clear()
        return out
