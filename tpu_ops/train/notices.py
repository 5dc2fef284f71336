"""Preemption notices: what the supervisor reads from ``RUN/_tpu_ops/notices/worker-<n>.json``.

An agent writes its notice the moment its VM gets SIGTERM (a spot preemption's ACPI soft-off,
or maintenance): ``{"worker", "incarnation", "time", "grace_s", "node"}``. The supervisor treats
one from the current incarnation as a preemption at once, instead of waiting for the API to
show PREEMPTED; before it reads the resume step it gives the workers their grace to save and
report (their exit reports say they are done).
"""

from __future__ import annotations

import time
from collections.abc import Collection
from typing import Any

from tpu_ops.layout import RunLayout
from tpu_ops.train.layout import list_json

# How often the supervisor lists the notices between its full polls (one small listing each time),
# so it starts recovering well within a second of the SIGTERM whatever the poll interval.
POLL_S = 0.5
# How long the supervisor waits for a notice when the control plane shows the hosts stopping first. The state
# and the SIGTERM come together; the agent's notice follows within about a second, so 5 s leaves room on a
# loaded machine and most of a spot VM's 30 s. Deleting the slice sooner would kill the save in hand.
NOTICE_WAIT_S = 5.0


def notices(gcs: Any, layout: RunLayout, incarnation_id: str, since: float = 0.0) -> list[dict[str, Any]]:
    """The notices of this incarnation (for an adopted slice, id '': every notice written since ``since``)."""
    docs = [d for d in list_json(gcs, layout.state("notices")) if isinstance(d, dict)]
    if incarnation_id:
        return [d for d in docs if d.get("incarnation") == incarnation_id]
    return [d for d in docs if float(d.get("time") or 0) >= since]


def await_notices(
    gcs: Any, layout: RunLayout, incarnation_id: str, hosts: int, since: float = 0.0,
    within_s: float = NOTICE_WAIT_S, poll_s: float = 0.1,
) -> list[dict[str, Any]]:  # fmt: skip
    """The notices of the incarnation, waiting up to ``within_s`` for a first one; [] sooner once every host
    has reported its exit (no worker is left to save)."""
    end = time.monotonic() + within_s
    while True:
        found = notices(gcs, layout, incarnation_id, since)
        if found or time.monotonic() >= end:
            return found
        if len(_reported(gcs, layout, incarnation_id)) >= hosts:
            return []
        time.sleep(poll_s)


def _reported(gcs: Any, layout: RunLayout, incarnation_id: str) -> set[tuple[int, Any]]:
    """The (slice, worker) hosts whose exit report of the incarnation exists."""
    reports = [r for r in list_json(gcs, layout.workers) if r.get("incarnation") == incarnation_id]
    return {(int(r.get("slice") or 0), r.get("worker")) for r in reports}


def wait_for_exit_reports(
    gcs: Any, layout: RunLayout, incarnation_id: str, hosts: int, found: list[dict[str, Any]], poll_s: float = 0.1,
    *, kept: Collection[tuple[int, int]] = (), stopped_until: float = 0.0,
) -> None:  # fmt: skip
    """Until every host's exit report of the incarnation exists, at most the notices' grace after the SIGTERM.

    ``kept``: the (slice, worker) hosts of the slices kept through a lost one's replacement. They were told to
    stop by a marker, so they stop later than the lost slice's SIGTERM and have a grace of their own: they
    may still commit a step and write step records until ``stopped_until``. Their reports are waited for
    until then (the lost slice's, without a notice, never come), so the step kept is read after their save.
    """
    until = max(float(d.get("time", 0)) + float(d.get("grace_s", 0)) for d in found) if found else 0.0
    while time.time() < max(until, stopped_until):
        got = _reported(gcs, layout, incarnation_id)
        if len(got) >= hosts or (time.time() >= until and set(kept) <= got):
            return
        time.sleep(poll_s)
