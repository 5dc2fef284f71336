"""The fleet view applied to a ranking: what the fleet holds now (:class:`View`, read by :func:`view_for`
from the reservation's own counts and the capacity summary's asks), and what it changes in a run's
ranking: a free reservation is not scarce (:func:`free_is_free`), one this run should leave goes last
(:func:`with_view`), and a walk may queue for a full one (:func:`queued`). The arithmetic is
:mod:`tpu_ops.provision.fleet`; :func:`tpu_ops.provision.ranking.order` applies it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from tpu_ops.provision import fleet
from tpu_ops.provision.choose import Choice, History, Rung, RunModel, rank

Key = tuple[str, str, str, str]


@dataclass(frozen=True)
class View:
    """The fleet now (:mod:`tpu_ops.provision.fleet`): free VMs per reservation name (absent: unknown),
    the gains of the fleet's recent asks for the reservation, and each reservation's VMs in all."""

    free: dict[str, int]
    recent_gains: tuple[float, ...] = ()
    size: dict[str, int] = field(default_factory=dict)


def queued(choice: Choice, rungs: Sequence[Rung], run: RunModel, histories: dict[Key, History], max_miss: float,
            view: View, wait_s: float) -> Choice:  # fmt: skip
    """``choice`` trying no rung now, to rank again in ``wait_s`` (``choose.queue``), if
    :func:`tpu_ops.provision.fleet.queue` says so."""
    names = {r.reservation for r in rungs if r.tier == "reservation" and r.reservation in view.free}
    if not names:
        return choice

    def later() -> Choice:  # ranked only once the cheaper guards pass: a walk over a free reservation ranks once
        shorter = replace(run, deadline_s=None if run.deadline_s is None else run.deadline_s - wait_s)
        return with_view(rank(rungs, shorter, histories, max_miss=max_miss), view)

    why = fleet.queue(choice, later, max(view.free[n] for n in names), sum(view.size.get(n, 0) for n in names),
                      view.recent_gains, run, wait_s)  # fmt: skip
    if why is None:
        return choice
    return replace(choice, try_now=0, wait_s=wait_s, note=f"{choice.note}; queued: {why}")


def free_is_free(rungs: Sequence[Rung], histories: dict[Key, History], view: View) -> dict[Key, History]:
    """A reservation the view says has a free VM now is not scarce now, whatever the history says of
    how often it was full: its refusals are left out of this ranking."""
    out = dict(histories)
    for r in rungs:
        if r.tier == "reservation" and view.free.get(r.reservation, 0) > 0 and r.key in out:
            out[r.key] = replace(out[r.key], stockouts=0.0)
    return out


def with_view(choice: Choice, view: View) -> Choice:
    """The reservation after every other rung when the view says this run should not take it now: it
    is full, or only its last VM is free and this run gains less from it than the fleet's median ask
    (:func:`tpu_ops.provision.fleet.admit`), so it is left to a run that gains more."""
    res = [r for r in choice.ranked if r.expectation.rung.tier == "reservation" and r.expectation.rung.reservation
           in view.free]  # fmt: skip
    if not res or choice.method != "cost":
        return choice
    free = min(view.free[r.expectation.rung.reservation] for r in res)
    g = fleet.gain(choice)
    if fleet.admit(g, free, view.recent_gains):
        return replace(choice, note=f"{choice.note}; fleet: {free} reservation VM(s) free, this run gains "
                       f"${g * 1000:.3f} per 1k kept steps from one")  # fmt: skip
    why = "full now (fleet view)" if free <= 0 else (
        f"its last free VM is left to a run that gains more (this one: ${g * 1000:.3f} per 1k kept steps)")  # fmt: skip
    moved = {id(r): replace(r, why=f"{why}; {r.why}") for r in res}
    # With patience (``try_now``), the reservation stays among the rungs tried before waiting, last of
    # them: waiting for it to free can still beat buying on-demand now (one refused request costs little).
    n = choice.try_now if choice.try_now is not None else len(choice.ranked)
    groups = (list(choice.ranked[:n]), list(choice.ranked[n:]))
    order = [r for grp in groups for r in [*(x for x in grp if id(x) not in moved), *(moved[id(x)] for x in grp
             if id(x) in moved)]]  # fmt: skip
    ranked = tuple(replace(r, position=i + 1) for i, r in enumerate(order))
    return replace(choice, ranked=ranked, note=f"{choice.note}; fleet: the reservation {why}")


ReadReservation = Callable[[str, str], "dict[str, Any] | None"]  # (zone, name) -> reservations.get's JSON


def _read_or_empty(read: ReadReservation, zone: str, name: str) -> dict[str, Any]:
    return read(zone, name) or {}


def view_for(steps: Sequence[Any], doc: dict[str, Any] | None, read: ReadReservation | None) -> View | None:
    """The fleet now, as a ranking sees it: each reservation rung's free VMs from the reservation's own
    ``count`` / ``inUseCount`` (``read``: the provider's ``reservation_document``), and the fleet's recent
    asks from the capacity summary ``doc``; None when no reservation's count could be read."""
    if read is None:
        return None
    free: dict[str, int] = {}
    size: dict[str, int] = {}
    for s in steps:
        zone, name = str(s.zone), str(s.reservation).rsplit("/", 1)[-1]
        if str(s.tier) == "reservation" and name and name not in free:
            live = fleet.counts(partial(_read_or_empty, read, zone, name))
            if live is not None:
                free[name], size[name] = live.free, live.count
    return View(free, fleet.asks(doc or {}), size) if free else None
