"""A voluntary move at a checkpoint boundary: is a rung ranked now worth leaving the held slice for?

The ladder ranks only when a run needs a slice (its start, a preemption). Capacity freed meanwhile
(a reservation VM handed back, spot back in a zone) stays unused by runs already placed until they
are preempted. At each committed checkpoint a run may rank its remaining work again (with the fleet
view) and move, make-before-break: the new slice is obtained while the old one trains, then the old
one's workers save the step in hand and stop, and the new one resumes there. The move costs both
slices held for ``move_s`` (the new one's boot and restore, the old one's save) and a refused
request at worst; it loses no step. The old slice's record ends ``"moved"``: its hours count for
its rung, not as a preemption (:func:`tpu_ops.provision.history.fold_run` reads preemptions only
from the record's ``preemptions``). Measured in ``bench/fleet_sim.py`` (``auto with moves``; see
docs/fleet.md, "Voluntary moves").
"""

from __future__ import annotations

from collections.abc import Callable
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
    overlap_s: float = 0.0  # the seconds both slices are held, as counted in ``move_usd``


Overlap = float | Callable[[Expectation], float]  # seconds both slices are held: one figure, or per target


def _cost(e: Expectation) -> float:
    return e.usd + e.scarcity_usd


def worth_moving(choice: Choice, held: int, move_s: Overlap, *, margin: float = MARGIN) -> Move | None:
    """The first rung ranked ahead of the held one (step number ``held``) worth moving to, or None to stay.

    A target must, for the remaining work:
    - make the deadline (``eligible``) and be no likelier to miss it than staying: a voluntary move
      takes no deadline risk that staying does not;
    - be priced below the held rung per hour (a reservation from spot or on-demand, spot from
      on-demand): between rungs of one price a move only bets on the preemption estimates, which lag
      a change (measured: spot-to-spot moves cost 0.2 points of the suite's mean saving, see docs/fleet.md);
    - cost less than staying by more than ``margin`` of staying. Staying costs the held rung's
      expected dollars (no scarcity charge: it is held, not asked for); moving, the target's (with its
      scarcity charge: it must be granted) plus ``move_s`` seconds at the held rung's price (the
      handover's overlap: the new slice's boot and restore, the old one's save; measured against the
      target's price, which makes a move to a prepaid reservation free: 0.07 points less).

    ``move_s``: one figure for every target (the simulator's ``boot_s + restore_s``), or a function of
    the target's expectation (the supervisor's: its believed obtain and recovery time), so each candidate
    is weighed with its own overlap in one pass.

    ``choice`` ranks the run's remaining work as a re-walk would (:func:`tpu_ops.provision.ranking.order`
    with the fleet view): a reservation that is full now, or whose last free VM is left to a run that
    gains more, is already ranked after every other rung there, so it is never a target here.
    """
    if choice.method != "cost":
        return None
    here = next((r for r in choice.ranked if r.expectation.rung.order == held), None)
    if here is None:
        return None
    h = here.expectation
    stay = h.usd
    for r in choice.ranked:
        if r is here:
            return None
        e = r.expectation
        if not r.eligible or e.miss_probability > h.miss_probability or e.rung.usd_per_hour >= h.rung.usd_per_hour:
            continue
        overlap = move_s(e) if callable(move_s) else move_s
        cost = _cost(e) + overlap / 3600.0 * h.rung.usd_per_hour
        if cost < stay * (1.0 - margin):
            why = (
                f"{e.rung.label()} is expected to cost ${cost:.2f} for the remaining work against "
                f"${stay:.2f} staying on {h.rung.label()}"
            )
            return Move(e.rung.order, stay, cost, why, overlap)
    return None
