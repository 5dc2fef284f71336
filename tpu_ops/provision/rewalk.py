"""A re-walk's ranking at a checkpoint, for a run already placed: is a move worth it (docs/moves.md)?

The ranking is the one :func:`tpu_ops.provision.ranking.apply` makes when the ladder walks (the history from
the capacity summary, the fleet view from the reservations' own counts), with the steps the checkpoint
keeps; unlike a walk it writes nothing unless the run moves (one ranking per committed checkpoint would
flood the ledger and the fleet's asks). The decision is :func:`tpu_ops.provision.moving.worth_moving`.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

from tpu_ops.cloud.clients import Clients
from tpu_ops.errors import TpuOpsError
from tpu_ops.provision import ranking
from tpu_ops.provision.choose import Choice, RunModel
from tpu_ops.provision.moving import Move, worth_moving
from tpu_ops.provision.prices import PriceTable
from tpu_ops.provision.steps import plan
from tpu_ops.specs.slice import ProvisionSpec

MOVE_EVENT = "move"  # the ledger event of a move decided (the plan it rests on and why)


def rank_now(
    spec: ProvisionSpec,
    clients: Clients,
    ledger: Any,
    table: PriceTable,
    kept: int,
    read: ranking.ReadReservation | None = None,
    now: float | None = None,
) -> tuple[Choice, RunModel, ranking.View | None]:
    """The run's remaining work (``kept`` steps already kept) ranked as a re-walk now would rank it."""
    now = time.time() if now is None else now
    started = min((float(e["t"]) for e in ledger.events() if "t" in e), default=now)
    run = ranking.run_model(spec, steps_done=kept, started_at=started, now=now)
    steps = plan(spec)
    summary = ranking.summary_for(spec, clients)
    view = ranking.view_for(steps, summary, read)
    _, choice = ranking.order(spec, steps, table, ranking.weigh(spec, summary, now), run, view=view)
    return choice, run, view


def move_s(choice: Choice, to: int) -> float:
    """The seconds a move to step ``to`` holds both slices, as the ranking believes: its obtain and recovery."""
    r = next(r for r in choice.ranked if r.expectation.rung.order == to)
    return r.expectation.belief.obtain_s + r.expectation.belief.recovery_s


def decide(choice: Choice, held: int) -> Move | None:
    """The move worth making from the held step ``held``, if any (each candidate with its own overlap)."""
    for r in choice.ranked:  # worth_moving takes one overlap: the first candidate's it would name
        if r.expectation.rung.order == held:
            return None
        m = worth_moving(choice, held, move_s(choice, r.expectation.rung.order))
        if m is not None and m.to == r.expectation.rung.order:
            return m
    return None


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
