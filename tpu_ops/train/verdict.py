"""What happened to a run's allocation: one pure function from observed facts to a verdict.

The supervisor observes (``train.watch``): each slice's state as its control plane reports it and its
hosts' states, the incarnation's SIGTERM notices, the workers' exit reports, the DONE marker, and how
long since the progress mark last moved. :func:`decide` turns those facts into one :class:`Verdict`;
the supervisor only acts on verdicts. Nothing here reads a clock, a file or the network.

Precedence, first match wins (a notice says more than a state the API has not caught up with yet):

1. ``finished``  — the DONE marker exists.
2. ``preempted`` — a SIGTERM notice (the slice and hosts that sent it);
   or a slice the control plane lost, is deleting, or no longer knows.
3. ``host lost`` — a slice that is up has a host whose VM is not (the API says so), or a worker
   was terminated (non-zero exit with ``terminated``) without a notice.
4. ``failed``    — a trainer exited non-zero on a healthy allocation (no recovery: the job is wrong).
5. ``stalled``   — no new step or log byte for ``stall_limit_s`` while some worker has not reported.
6. ``healthy``.

A stall and a preemption are different verdicts: the supervisor recovers from both but gives up
on a stall seen twice at the same step.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from tpu_ops.provision.providers.base import Phase, SliceState

# A host whose VM is in one of these states is not coming back by itself (Compute Engine statuses).
HOST_DOWN: Final = frozenset({"TERMINATED", "STOPPED", "STOPPING", "SUSPENDED", "SUSPENDING"})


class Kind:
    """The verdicts, and what the supervisor does about each."""

    HEALTHY: Final = "healthy"
    STALLED: Final = "stalled"
    PREEMPTED: Final = "preempted"
    HOST_LOST: Final = "host lost"
    FINISHED: Final = "finished"
    FAILED: Final = "failed"
    RECOVER: Final = frozenset({STALLED, PREEMPTED, HOST_LOST})  # give the slice back, take a new one
    LOST: Final = frozenset({PREEMPTED, HOST_LOST})  # capacity went away (a stall is not that)


@dataclass(frozen=True)
class SliceFacts:
    """One slice of the allocation as its control plane describes it; ``phase`` None: it does not know it."""

    index: int
    phase: Phase | None
    raw_state: str = ""
    host_states: tuple[str, ...] = ()  # per host, in worker order ("" unknown)


@dataclass(frozen=True)
class Facts:
    """What the supervisor observed of one incarnation. ``slices`` empty: the API was not asked this time
    (between full polls only the notices are read)."""

    slices: tuple[SliceFacts, ...] = ()
    notices: tuple[Mapping[str, Any], ...] = ()
    reports: tuple[Mapping[str, Any], ...] = ()
    done: Mapping[str, Any] | None = None
    hosts: int = 1  # every host of every slice
    since_progress_s: float = 0.0
    stall_limit_s: float = float("inf")


@dataclass(frozen=True)
class Verdict:
    """What happened, where (the slice and its hosts, when it concerns some), and why in words."""

    kind: str
    reason: str = ""
    slice: int | None = None
    hosts: tuple[int, ...] = ()
    detail: Mapping[str, Any] = field(default_factory=dict)
    # The control plane shows hosts stopping (preempted, suspended): their agents got SIGTERM with it, and
    # their notices may still be on the way.
    notice_due: bool = False

    @property
    def recover(self) -> bool:
        return self.kind in Kind.RECOVER


HEALTHY = Verdict(Kind.HEALTHY)


def _where(docs: Sequence[Mapping[str, Any]]) -> tuple[int | None, tuple[int, ...]]:
    """The one slice the documents come from (None if several) and their workers."""
    slices = {int(d.get("slice", 0)) for d in docs}
    return (slices.pop() if len(slices) == 1 else None), tuple(sorted(int(d.get("worker", -1)) for d in docs))


def notice_reason(found: Sequence[Mapping[str, Any]]) -> str:
    """The reason a preemption notice gives (``slice S`` named only beyond the first slice)."""
    names = sorted((int(d.get("slice", 0)), int(d.get("worker", -1))) for d in found)
    text = ", ".join(f"{w}" if s == 0 else f"{w} of slice {s}" for s, w in names)  # slice 0 reads as it always did
    return f"preemption notice (SIGTERM) from worker {text}"


def decide(f: Facts) -> Verdict:
    """The verdict on an allocation (see the module docstring for the precedence)."""
    if f.done is not None:
        return Verdict(Kind.FINISHED, "DONE", detail=dict(f.done))
    if f.notices:
        where, hosts = _where(f.notices)
        return Verdict(Kind.PREEMPTED, notice_reason(f.notices), where, hosts)
    for s in f.slices:
        if s.phase is None:
            return Verdict(Kind.PREEMPTED, "slice missing", s.index)
        if s.phase not in SliceState.RUNNING and s.phase != Phase.BOOTING:
            return Verdict(Kind.PREEMPTED, s.raw_state or str(s.phase), s.index, notice_due=True)
    for s in f.slices:
        down = tuple(i for i, st in enumerate(s.host_states) if st.upper() in HOST_DOWN)
        if s.phase in SliceState.RUNNING and down:
            reason = f"host {', '.join(map(str, down))} {s.host_states[down[0]]}"
            return Verdict(Kind.HOST_LOST, reason, s.index, down, notice_due=True)
    terminated = [r for r in f.reports if r.get("terminated") and r.get("exit_code") != 0]
    if terminated:
        where, hosts = _where(terminated)
        return Verdict(Kind.HOST_LOST, "workers terminated", where, hosts)
    failed = [r for r in f.reports if r.get("exit_code") != 0]
    if failed:
        first = min(failed, key=lambda r: (int(r.get("slice", 0)), int(r["worker"])))
        where = int(first.get("slice", 0))
        return Verdict(Kind.FAILED, f"exit {first['exit_code']}", where, (int(first["worker"]),), dict(first))
    if f.since_progress_s > f.stall_limit_s and len(f.reports) < f.hosts:
        return Verdict(Kind.STALLED, f"stalled: no new step for {f.stall_limit_s:.0f}s")
    return HEALTHY
