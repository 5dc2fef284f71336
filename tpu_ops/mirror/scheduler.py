"""Run copy units on a pool of ``concurrency`` threads; raise on the first failure.

Objects are started biggest first, so they do not form the tail. A large object's parts run
like any other unit; when its last part is verified, its :class:`ComposeParts` is queued ahead of
new objects. At most ``concurrency + 2`` units are in flight, so memory stays bounded whatever
the sizes. Each unit runs under the one retry policy for transient errors, and a checksum
mismatch is retried a few times before it fails the run.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, TypeVar

from tpu_ops.cloud import retry
from tpu_ops.errors import ChecksumMismatchError
from tpu_ops.mirror.records import Copied, SourceObject
from tpu_ops.mirror.strategies import ComposeParts, CopyContext, PartCopy, Unit, part_ranges, units_for
from tpu_ops.settings import Settings

log = logging.getLogger(__name__)

MISMATCH_ATTEMPTS = 3
T = TypeVar("T")


def with_retries(settings: Settings, fn: Callable[[], T]) -> T:
    """Transient errors under the one retry policy; a checksum mismatch a few times, then fail."""
    for attempt in range(1, MISMATCH_ATTEMPTS + 1):
        try:
            return retry.call(settings, fn)
        except ChecksumMismatchError as exc:
            if attempt == MISMATCH_ATTEMPTS:
                raise ChecksumMismatchError(f"{exc} (after {attempt} attempts)") from exc
            log.warning("checksum mismatch, retrying (%d/%d): %s", attempt, MISMATCH_ATTEMPTS, exc)
    raise AssertionError("unreachable")


@dataclass
class _Parts:
    """The parts of one large object still being copied, and their CRC32Cs so far."""

    ranges: list[tuple[int, int]]
    crcs: dict[int, int]

    def done(self, unit: PartCopy, part_crc: int) -> ComposeParts | None:
        """Record a verified part; the compose unit once every part is in."""
        self.crcs[unit.index] = part_crc
        if len(self.crcs) < len(self.ranges):
            return None
        return ComposeParts(unit.src, tuple(self.ranges), tuple(self.crcs[i] for i in range(len(self.ranges))))


class _Run:
    """The bookkeeping of one ``copy_all``: units waiting, parts in progress, results."""

    def __init__(self, ctx: CopyContext, objects: list[SourceObject]) -> None:
        self.ctx = ctx
        self.pending: Iterator[Unit] = (
            u for o in sorted(objects, key=lambda o: -o.size) for u in units_for(o, ctx.ranged_min, ctx.part_bytes)
        )
        self.ready: deque[Unit] = deque()
        self.parts: dict[str, _Parts] = {}
        self.done: list[Copied] = []
        self.bytes_done = 0

    def next_unit(self) -> Unit | None:
        return self.ready.popleft() if self.ready else next(self.pending, None)

    def finished(self, unit: Unit, result: Any) -> bool:
        """Account for a finished unit; whether an object is now complete."""
        if isinstance(unit, PartCopy):
            parts = self.parts.get(unit.src.rel)
            if parts is None:
                parts = self.parts[unit.src.rel] = _Parts(part_ranges(unit.src.size, self.ctx.part_bytes), {})
            self.bytes_done += unit.rng[1] - unit.rng[0]
            compose = parts.done(unit, result)
            if compose is not None:
                del self.parts[unit.src.rel]
                self.ready.append(compose)
            return False
        if not isinstance(unit, ComposeParts):
            self.bytes_done += unit.src.size
        self.done.append(result)
        return True


def copy_all(
    ctx: CopyContext, objects: list[SourceObject], on_progress: Callable[[int, int], None] | None = None
) -> list[Copied]:
    """Copy ``objects`` with at most ``ctx.concurrency`` units running; raise on the first failure.

    ``on_progress(objects_done, bytes_done)`` is called from this (the calling) thread.
    """
    run = _Run(ctx, objects)
    flight: dict[Future[Any], Unit] = {}
    with ThreadPoolExecutor(ctx.concurrency, thread_name_prefix="mirror") as pool:
        try:
            while True:
                while len(flight) < ctx.concurrency + 2 and (unit := run.next_unit()) is not None:
                    flight[pool.submit(with_retries, ctx.settings, _bind(unit, ctx))] = unit
                if not flight:
                    break
                finished, _ = wait(flight, return_when=FIRST_COMPLETED)
                for fut in finished:
                    if run.finished(flight.pop(fut), fut.result()) and on_progress:
                        on_progress(len(run.done), run.bytes_done)
        except BaseException:
            for fut in flight:
                fut.cancel()
            raise
    return run.done


def _bind(unit: Unit, ctx: CopyContext) -> Callable[[], Any]:
    def call() -> Any:
        return unit.run(ctx)

    return call
