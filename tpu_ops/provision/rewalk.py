"""A re-walk's ranking at a checkpoint, for a run already placed: is a move worth it (docs/moves.md)?

The ranking is the one :func:`tpu_ops.provision.ranking.apply` makes when the ladder walks (the history from
the capacity summary, the fleet view from the reservations' own counts), with the steps the checkpoint
keeps. Unlike a walk it writes only the run's ask for the reservation (its capacity summary entry,
replaced each time) unless the run moves: a ranking every ``choose.move_every`` would flood the ledger.
The decision is :func:`tpu_ops.provision.moving.worth_moving`.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

from tpu_ops.cloud.clients import Clients
from tpu_ops.errors import TpuOpsError
from tpu_ops.provision import ranking, viewing
from tpu_ops.provision.choose import Choice, Expectation, RunModel
from tpu_ops.provision.moving import Move, worth_moving
from tpu_ops.provision.prices import PriceTable
from tpu_ops.provision.steps import plan
from tpu_ops.specs.slice import ProvisionSpec

MOVE_EVENT = "move"  # the ledger event of a move decided (the plan it rests on and why)
OVER_BUDGET = "over budget"  # how the reason for a move the budget refuses starts


def rank_now(
    spec: ProvisionSpec,
    clients: Clients,
    table: PriceTable,
    kept: int,
    started_at: float,
    read: viewing.ReadReservation | None = None,
    now: float | None = None,
    run_id: str | None = None,
) -> tuple[Choice, RunModel, viewing.View | None]:
    """The run's remaining work (``kept`` steps already kept) ranked as a re-walk now would rank it; with
    ``run_id``, its ask for the reservation kept in the capacity summary as a walk keeps it.

    ``started_at``: the run's start (its run state's), from which ``choose.max_duration`` counts. A walk
    reads it from the ledger's first event; a checkpoint's ranking is not given the ledger, whose reading
    grows with the run."""
    now = time.time() if now is None else now
    run = ranking.run_model(spec, steps_done=kept, started_at=started_at, now=now)
    steps = plan(spec)
    summary = ranking.summary_for(spec, clients)
    view = viewing.view_for(steps, summary, read)
    _, choice = ranking.order(spec, steps, table, ranking.weigh(spec, summary, now), run, view=view)
    if run_id is not None:
        ranking.keep_ask(spec, clients, run_id, choice, view, now)
    return choice, run, view


def overlap_s(e: Expectation) -> float:
    """The seconds a move to ``e``'s rung holds both slices, as the ranking believes: its obtain and recovery."""
    return e.belief.obtain_s + e.belief.recovery_s


def move_s(choice: Choice, to: int) -> float:
    """:func:`overlap_s` of the rung of step ``to`` in ``choice``."""
    return overlap_s(next(r.expectation for r in choice.ranked if r.expectation.rung.order == to))


def decide(choice: Choice, held: int) -> Move | None:
    """The move worth making from the held step ``held``, if any: each candidate with its own overlap."""
    return worth_moving(choice, held, overlap_s)


def over_budget(
    spec: ProvisionSpec, table: PriceTable, spent_usd: float, run: RunModel, choice: Choice, held: int, move: Move
) -> str:
    """Why ``move`` would take the run past ``budget_usd``, or '' when it fits.

    Counted as the budget and the ledger count (list prices, a reservation's too: the ranking's prepaid
    reservation is free to use, not to own): the run's spend so far (``spent_usd``, the ledger's cost),
    the overlap (``move.overlap_s`` of the held slice, which trains on while the target boots), and the
    remaining work (``run``: steps left x seconds per step) at the target's price."""
    acc = spec.slice.accelerator
    rungs = {r.expectation.rung.order: r.expectation.rung for r in choice.ranked}
    here, to = rungs[held], rungs[move.to]
    overlap = move.overlap_s / 3600.0 * acc.chips * table.price(acc.generation, here.tier)
    hours = run.steps * run.seconds_per_step / 3600.0
    rest = hours * acc.chips * table.price(acc.generation, to.tier)
    total, budget = spent_usd + overlap + rest, float(spec.budget_usd)
    if total <= budget + 1e-9:
        return ""
    return (
        f"{OVER_BUDGET}: ${spent_usd:,.2f} spent + ${overlap:,.2f} for {move.overlap_s:.0f} s of both slices + "
        f"${rest:,.2f} for the remaining {hours:.2f} h on {to.label()} = ${total:,.2f} exceeds budget_usd "
        f"${budget:,.2f}"
    )


def record(
    spec: ProvisionSpec, clients: Clients, run_id: str, ledger: Any, table: PriceTable, choice: Choice,
    run: RunModel, move: Move, run_from: str,
) -> dict[str, Any]:  # fmt: skip
    """Keep the plan a move rests on (ledger ``move`` event, ``plan.json`` with its ``move``); the plan."""
    doc = ranking.plan_document(spec, choice, run, table)
    doc["move"] = {"from": run_from, "to": move.to, "stay_usd": round(move.stay_usd, 6),
                   "move_usd": round(move.move_usd, 6), "why": move.why}  # fmt: skip
    ledger.append(MOVE_EVENT, plan=doc)
    with contextlib.suppress(TpuOpsError):  # the ledger has it
        ranking.write_plan(spec, clients, run_id, doc)
    return doc
