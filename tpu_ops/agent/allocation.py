"""The run's allocation as a worker sees it: its document, and the DONE marker over every process. Stdlib only.

A worker of a multislice run starts only once the supervisor has written the document of its
incarnation (every slice up: :func:`tpu_ops.agent.job.placement` reads it); a worker whose slice was
kept while another was replaced waits for the next incarnation's document, which lists it in ``kept``.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

from tpu_ops.agent.gcs import Gcs, GcsError
from tpu_ops.agent.job import RunPaths

WAIT_S = 1800.0  # at most the ladder's queue time for the other slices
DONE_WAIT_S = 120.0


def wait_for_document(
    gcs: Gcs,
    bucket: str,
    key: str,
    wanted: Callable[[dict[str, Any]], bool],
    give_up: Callable[[], bool],
    tick: Callable[[], None] | None = None,
    every_s: float = 1.0,
    timeout_s: float = WAIT_S,
) -> dict[str, Any] | None:
    """The allocation document once ``wanted(doc)``; None when ``give_up()`` or after ``timeout_s``.
    ``tick`` runs every ``every_s`` meanwhile (a heartbeat)."""
    deadline, last = time.monotonic() + timeout_s, 0.0
    while time.monotonic() < deadline and not give_up():
        try:
            doc = gcs.read_json(bucket, key)
        except GcsError:
            doc = None
        if isinstance(doc, dict) and wanted(doc):
            return doc
        if tick is not None and time.monotonic() - last >= every_s:
            tick()
            last = time.monotonic()
        time.sleep(0.2)
    return None


def commit_done(gcs: Gcs, paths: RunPaths, run_id: str, incarnation: str, processes: int) -> None:
    """Process 0: DONE once every process (every host of every slice) of this incarnation reported exit 0."""
    deadline = time.monotonic() + DONE_WAIT_S
    while time.monotonic() < deadline:
        reports = [
            r for r in gcs.list_json(paths.bucket, paths.state("workers")) if r.get("incarnation") == incarnation
        ]
        if any(r["exit_code"] != 0 for r in reports):
            return
        if len({(r.get("slice", 0), r["worker"]) for r in reports}) >= processes:
            done = {"run_id": run_id, "time": time.time(), "incarnation": incarnation}
            gcs.write_json(paths.bucket, paths.done, done)
            print(f"tpu-ops agent: run {run_id} done", flush=True)
            return
        time.sleep(0.2)
    print("tpu-ops agent: not every worker reported success; no DONE marker", file=sys.stderr, flush=True)


def next_incarnation(gcs: Gcs, paths: RunPaths, current: str, cancelled: Callable[[], bool]) -> dict[str, Any] | None:
    """The allocation document once it names an incarnation after ``current``; None if ``cancelled``."""
    return wait_for_document(
        gcs, paths.bucket, paths.allocation, lambda d: d.get("incarnation") not in (None, current), cancelled
    )


def stop_requested(gcs: Gcs, paths: RunPaths, incarnation: str) -> bool:
    """The supervisor's marker asking every worker of ``incarnation`` to save the step in hand and stop
    (another slice was lost, or the run moves); False when GCS cannot say."""
    try:
        return gcs.exists(paths.bucket, paths.state(f"stop/{incarnation}.json"))
    except GcsError:
        return False


def write_notice(gcs: Gcs, paths: RunPaths, doc: dict[str, Any], worker: int, slice_index: int) -> None:
    """This worker's SIGTERM notice (``doc``: who, when, the grace), for the supervisor's recovery."""
    try:
        gcs.write_json(paths.bucket, paths.notice(worker, slice_index), doc)
        print(f"tpu-ops agent: SIGTERM: notice written; the trainer has {doc['grace_s']:g}s", flush=True)
    except GcsError as exc:
        print(f"tpu-ops agent: SIGTERM: notice not written: {exc}", file=sys.stderr, flush=True)
