"""The fleet view: who holds what reservation capacity now, and who should get what is free.

Runs are ranked one at a time, so without a view of the fleet the reservation goes to whoever asks
first, and the runs that lose most on spot (long checkpoint intervals, tight deadlines) get less of it
than those that lose little (issue 30). This module holds what every run can know of the others:

- **who holds what**: each run's entry in the capacity summary says which slice it holds now
  (:func:`holding`, from its run state); :func:`holders` lists the runs on a reservation;
- **what the reservation itself says**: on Compute Engine, ``reservations.get`` answers
  ``specificReservation.count`` and ``inUseCount``; :func:`counts` reads them through any callable
  returning that document (the provider, the fake in process, a test), so the source can change;
- **who gains most**: a run's gain from the reservation is the expected $ per kept step it saves by
  holding it instead of its next-best rung (:func:`gain`); when several runs ask at once,
  :func:`allocate` gives the free VMs to the largest gains; a run asking alone for the *last* free VM
  gets it only if it gains at least the median of the fleet's recent asks (:func:`admit`), so one
  that loses little on spot leaves it to the next that loses much;
- **who queues for it**: a run that finds the reservation full, would win a freed VM and has time to
  spare waits for one rather than buy other capacity now (:func:`queue`): the reservation is paid for
  whether used or not, so work moved into its hours costs nothing, and a wait costs time, not money.

Pure functions, no I/O.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from tpu_ops.provision.choose import Choice, Expectation, RunModel

RECENT_ASKS: Final = 50  # the gains remembered to set the bar for the last free VM
ENDLESS: Final = 1.0  # $ per kept step: a gain only the reservation makes possible, as kept in JSON
# The slack a queued run keeps after each wait: this share of its remaining work, plus QUEUE_ROOM_S, so that
# its other rungs, preemptions included, still make the deadline if no VM frees (measured: docs/fleet.md).
QUEUE_ROOM_SHARE: Final = 0.5
QUEUE_ROOM_S: Final = 3600.0


@dataclass(frozen=True)
class Counts:
    """A reservation's VMs: how many it holds, how many are in use."""

    count: int
    in_use: int

    @property
    def free(self) -> int:
        return max(0, self.count - self.in_use)


def counts(read: Callable[[], dict[str, Any]]) -> Counts | None:
    """``count`` / ``inUseCount`` of a reservation document (Compute Engine's ``reservations.get``, whose
    int64 fields arrive as strings); None when ``read`` answers nothing usable."""
    try:
        doc = read()
        spec = doc.get("specificReservation") or {}
        return Counts(int(spec["count"]), int(spec.get("inUseCount", 0)))
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


def holding(record: dict[str, Any]) -> dict[str, Any] | None:
    """The slice a run's state says it holds now (its last incarnation, ready and not ended), or None."""
    incs = [i for i in record.get("incarnations") or [] if isinstance(i, dict)]
    # A finished run holds nothing; a goodput report (``wall_s``) is written when its run ends.
    if not incs or record.get("finished_at") is not None or "wall_s" in record:
        return None
    last = incs[-1]
    if last.get("ready_at") is None or last.get("ended_at") is not None:
        return None
    out = {"zone": last.get("zone"), "tier": last.get("tier"), "since": last.get("ready_at")}
    if last.get("reservation"):
        out["reservation"] = last["reservation"]
    return out


def holders(doc: dict[str, Any], zone: str) -> list[str]:
    """The runs of a capacity summary that hold a reservation VM in ``zone`` now."""
    out = []
    for run_id, e in sorted((doc.get("runs") or {}).items()):
        h = e.get("holds") if isinstance(e, dict) else None
        if isinstance(h, dict) and h.get("tier") == "reservation" and h.get("zone") == zone:
            out.append(run_id)
    return out


def free_now(doc: dict[str, Any], zone: str, count: int, live: Counts | None = None) -> int:
    """Free VMs of a reservation of ``count`` in ``zone``: from the reservation's own ``inUseCount``
    when it is known (it also counts VMs of runs that publish nothing), else from the run states."""
    if live is not None:
        return live.free
    return max(0, count - len(holders(doc, zone)))


def gain(choice: Choice) -> float:
    """Expected $ per kept step this run saves on the reservation against its next-best eligible rung
    (0 without a reservation rung or another eligible rung; inf when only the reservation finishes)."""
    eligible = [r.expectation for r in choice.ranked if r.eligible]
    res = [e for e in eligible if e.rung.tier == "reservation"]
    rest = [e for e in eligible if e.rung.tier != "reservation"]
    if not res or not rest:
        return 0.0
    best_res = min(res, key=_per_step)
    best_rest = min(rest, key=_per_step)
    if math.isinf(_per_step(best_rest)):
        return math.inf
    return max(0.0, _per_step(best_rest) - _per_step(best_res))


def _per_step(e: Expectation) -> float:
    """$ per kept step without the scarcity charge: the view, not the history, says whether it is free."""
    paid = e.usd + e.scarcity_usd
    if math.isinf(e.usd_per_step) or paid <= 0:
        return e.usd_per_step
    return e.usd_per_step * e.usd / paid


@dataclass(frozen=True)
class Claim:
    """A run asking for the reservation: its id, its gain, when it asked."""

    run_id: str
    gain: float
    asked_at: float = 0.0


def allocate(free: int, claims: Sequence[Claim]) -> list[str]:
    """The runs that get the ``free`` VMs when ``claims`` arrive at once: largest gain first (then
    earliest ask), not first come."""
    ranked = sorted((c for c in claims if c.gain > 0), key=lambda c: (-c.gain, c.asked_at, c.run_id))
    return [c.run_id for c in ranked[: max(0, free)]]


def ask(gain_: float, at: float) -> dict[str, float]:
    """A run's ask for the reservation as its capacity summary entry keeps it (``ask``); a gain only the
    reservation makes possible (inf) is kept as ``ENDLESS`` (JSON has no infinity)."""
    return {"gain": gain_ if math.isfinite(gain_) else ENDLESS, "at": at}


def asks(doc: dict[str, Any]) -> tuple[float, ...]:
    """The gains of the fleet's recent asks, oldest first: each run's last ask in a capacity summary
    (its entry's ``ask``), the newest ``RECENT_ASKS`` of them."""
    rows = []
    for e in (doc.get("runs") or {}).values():
        a = e.get("ask") if isinstance(e, dict) else None
        if isinstance(a, dict) and isinstance(a.get("gain"), int | float) and isinstance(a.get("at"), int | float):
            rows.append((float(a["at"]), float(a["gain"])))
    return tuple(g for _, g in sorted(rows)[-RECENT_ASKS:])


def admit(gain_: float, free: int, recent: Sequence[float]) -> bool:
    """Whether a run asking alone takes a free VM: any while two or more are free; the last one only
    with a gain at least the median of the fleet's recent asks (none yet: yes)."""
    if free <= 0 or gain_ <= 0:
        return False
    if free > 1 or not recent:
        return True
    return gain_ >= statistics.median(recent[-RECENT_ASKS:])


def best_other(choice: Choice) -> float:
    """$ per kept step of the cheapest rung that makes the deadline and is not a reservation (inf: none)."""
    return min((r.expectation.usd_per_step for r in choice.ranked
                if r.eligible and r.expectation.rung.tier != "reservation"), default=math.inf)  # fmt: skip


def queue(choice: Choice, later: Callable[[], Choice], free: int, size: int, recent: Sequence[float], run: RunModel,
          wait_s: float) -> str | None:  # fmt: skip
    """Why this run should wait ``wait_s`` (``choose.queue``) for the reservation instead of taking another rung
    now (None: it should not). ``choice`` ranks it now, ``later()`` the same ``wait_s`` later (called last, only
    if the other guards pass); ``free`` and ``size``: the reservation's VMs free and in all. All must hold:

    - the reservation has VMs and all are in use (a free one it may take now; none at all never frees);
    - a freed VM would go to this run: its gain is at least the median of the fleet's recent asks
      (:func:`admit`, as for the last free VM);
    - after the wait it keeps ``QUEUE_ROOM_SHARE`` of its remaining work plus ``QUEUE_ROOM_S`` of slack;
    - the wait does not make its best other rung dearer (per kept step, deadline risk included): it
      costs time, not money."""
    if choice.method != "cost" or size <= 0 or free > 0 or run.deadline_s is None:
        return None
    g = gain(choice)
    if not admit(g, 1, recent):
        return None
    slack = run.deadline_s - wait_s - run.work_s
    if slack < QUEUE_ROOM_SHARE * run.work_s + QUEUE_ROOM_S or best_other(later()) > best_other(choice):
        return None
    return (f"the reservation is full and a freed VM would go to this run (it gains ${g * 1000:.3f} per 1k "
            f"kept steps), with {slack / 3600:.1f} h of slack left after the wait: waiting "
            f"{wait_s:.0f} s for it costs time, not money")  # fmt: skip
