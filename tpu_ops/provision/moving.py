"""A voluntary move at a checkpoint boundary: is a rung ranked now worth leaving the held slice for?

The ladder ranks only when a run needs a slice (its start, a preemption). Capacity freed meanwhile
(a reservation VM handed back, spot back in a zone) stays unused by runs already placed until they
are preempted. At each committed checkpoint a run may rank its remaining work again (with the fleet
view) and move, make-before-break: the new slice is obtained while the old one trains, then the old
one's workers save the step in hand and stop, and the new one resumes there. The move costs both
slices held for ``move_s`` (the new one's boot and restore, the old one's save) and a refused
request at worst; it loses no step.
"""

from __future__ import annotations

from dataclasses import dataclass

from tpu_ops.provision.choose import Choice, Expectation

MARGIN = 0.1  # a move must save this share of staying's expected cost: estimates are rough, moves are not free


@dataclass(frozen=True)
class Move:
    """The rung to move to and the expected dollars over the remaining work."""

    to: int  # the step number (the rung's ``order``) to request
    stay_usd: float  # expected cost of staying on the held rung
    move_usd: float  # expected cost on ``to``, the handover's overlap included
    why: str


def _cost(e: Expectation) -> float:
    return e.usd + e.scarcity_usd


def worth_moving(choice: Choice, held: int, move_s: float, *, margin: float = MARGIN) -> Move | None:
    """The first rung ranked ahead of the held one (step number ``held``) that makes the deadline and
    is expected to cost less than staying by more than ``margin`` of staying, the overlap of
    ``move_s`` seconds at the held rung's price included; None to stay.

    ``choice`` ranks the run's remaining work as a re-walk would (:func:`tpu_ops.provision.ranking.order`
    with the fleet view): a reservation that is full now, or whose last free VM is left to a run that
    gains more, is already ranked after every other rung there, so it is never a target here.
    """
    if choice.method != "cost":
        return None
    by_order = {r.expectation.rung.order: r for r in choice.ranked}
    here = by_order.get(held)
    if here is None:
        return None
    stay = _cost(here.expectation)
    overlap = move_s / 3600.0 * here.expectation.rung.usd_per_hour
    for r in choice.ranked:
        if r.position >= here.position:
            return None
        if not r.eligible:
            continue
        cost = _cost(r.expectation) + overlap
        if cost < stay * (1.0 - margin):
            why = (
                f"{r.expectation.rung.label} is expected to cost ${cost:.2f} for the remaining work against "
                f"${stay:.2f} staying on {here.expectation.rung.label}"
            )
            return Move(r.expectation.rung.order, stay, cost, why)
    return None
