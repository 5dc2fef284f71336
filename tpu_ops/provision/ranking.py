"""The ladder's choice, wired: a spec's ``choose`` + the price table + the capacity history → the
attempts in the order to try them, and the plan that says why.

The arithmetic is :mod:`tpu_ops.provision.choose` (pure); the history is
:mod:`tpu_ops.provision.history` (read from the checkpoint bucket). The ladder calls :func:`order`
each time it walks, so a walk after a preemption ranks with the steps and the time then left.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, Final, Literal, Protocol

from tpu_ops.cloud.clients import Clients
from tpu_ops.errors import ConfigError
from tpu_ops.provision.choose import Choice, History, Rung, RunModel, rank
from tpu_ops.provision.prices import PriceTable
from tpu_ops.provision.viewing import ReadReservation, View, free_is_free, queued, view_for, with_view
from tpu_ops.specs.choose import ChooseSpec
from tpu_ops.specs.slice import ProvisionSpec

CHOICE_EVENT: Final = "choice"  # the ledger event that records each ranking
Key = tuple[str, str, str, str]
Progress = Callable[[], "int | None"]  # steps already kept (the newest complete checkpoint)


class StepLike(Protocol):
    """What the ranking needs of the ladder's planned attempts."""

    @property
    def number(self) -> int: ...
    @property
    def tier(self) -> str: ...
    @property
    def zone(self) -> str: ...
    @property
    def reservation(self) -> str: ...


def backend_of(spec: ProvisionSpec) -> str:
    """The control plane the spec resolves to (``tpu-api`` before the Compute Engine provider)."""
    return str(getattr(spec.slice, "resolved_backend", "tpu-api"))


ReservationPrice = Literal["opportunity", "prepaid", "list"]


def rank_price(table: PriceTable, generation: str, tier: str, reservation: ReservationPrice = "prepaid") -> float:
    """Dollars per chip-hour the ranking charges for ``tier``: its list price, except a reservation.

    A reservation is billed whether used or not, so using it costs nothing extra (``prepaid``, the
    default: 0); that it is scarce is the scarcity charge's business (:mod:`tpu_ops.provision.choose`):
    the more often the fleet finds it full, the more an hour of it costs a run that would do nearly as
    well elsewhere. ``opportunity`` charges it a fixed stand-in for that, the price of the slice's
    cheapest tier, spot, whatever the demand; ``list`` its list price (the fleet simulator compares).
    """
    if tier != "reservation" or reservation == "list":
        return table.price(generation, tier)
    if reservation == "prepaid":
        return 0.0
    try:
        return table.price(generation, "spot")
    except ConfigError:  # no spot price for this generation: nothing to compare it with
        return 0.0


def candidates(
    spec: ProvisionSpec,
    steps: Sequence[StepLike],
    table: PriceTable,
    reservation: ReservationPrice = "prepaid",
    scarcity: bool = True,
) -> list[Rung]:
    """One candidate per planned attempt, priced for the whole slice (a reservation: :func:`rank_price`),
    with on-demand as the fallback a scarce rung's charge is measured against (``scarcity``)."""
    acc = spec.slice.accelerator
    backend = backend_of(spec)
    fallback = 0.0
    if scarcity:
        with contextlib.suppress(ConfigError):  # no on-demand price: no scarcity charge
            fallback = acc.chips * table.price(acc.generation, "on-demand")
    out = []
    for s in steps:
        usd_per_hour = acc.chips * rank_price(table, acc.generation, str(s.tier), reservation)
        name = s.reservation.rsplit("/", 1)[-1]
        out.append(Rung(acc.name, s.zone, str(s.tier), backend, usd_per_hour, name, s.number, fallback))
    return out


def run_model(
    spec: ProvisionSpec, *, steps_done: int = 0, started_at: float | None = None, now: float | None = None
) -> RunModel:
    """What is left of the run, from the spec's ``choose`` (a bare slice counts seconds as steps)."""
    c = spec.choose or ChooseSpec()
    now = time.time() if now is None else now
    started = now if started_at is None else started_at
    if c.steps is not None:
        total = c.steps
        seconds_per_step = spec.hours * 3600.0 / total
        every = c.checkpoint_every or max(1, round(c.checkpoint_interval.total_seconds() / seconds_per_step))
    else:  # no step count: one "step" per second of the expected hours
        total, seconds_per_step = max(1, round(spec.hours * 3600.0)), 1.0
        every = max(1, round(c.checkpoint_interval.total_seconds()))
    deadline: float | None = None
    if c.finish_by is not None:
        deadline = c.finish_by.timestamp() - now
    if c.max_duration is not None:
        rel = started + c.max_duration.total_seconds() - now
        deadline = rel if deadline is None else min(deadline, rel)
    left = max(1, total - max(0, steps_done))
    return RunModel(left, seconds_per_step, every, deadline)


def order(
    spec: ProvisionSpec,
    steps: Sequence[Any],
    table: PriceTable,
    histories: dict[Key, History],
    run: RunModel,
    reservation: ReservationPrice = "prepaid",
    scarcity: bool = True,
    view: View | None = None,
    queue: bool = False,
) -> tuple[list[Any], Choice]:
    """The planned attempts reordered by the choice (their numbers, hence resource names, kept).
    ``reservation``: how a reservation is priced (:func:`rank_price`); ``scarcity``: whether contended
    rungs carry their scarcity charge (:mod:`tpu_ops.provision.choose`); the fleet simulator compares.
    ``view``: what the fleet holds now (:func:`with_view`); ``queue``: a walk, which may wait for a full
    reservation (``choose.queue``: :func:`tpu_ops.provision.viewing.queued`)."""
    c = spec.choose or ChooseSpec()
    rungs = candidates(spec, steps, table, reservation, scarcity)
    wait_s = c.wait.total_seconds() if c.wait is not None else None
    if view is not None:
        histories = free_is_free(rungs, histories, view)
    choice = rank(rungs, run, histories, max_miss=c.max_miss, wait_s=wait_s)
    if view is not None:
        choice = with_view(choice, view)
        if queue and c.queue is not None and choice.try_now is None:
            choice = queued(choice, rungs, run, histories, c.max_miss, view, c.queue.total_seconds())
    by_number = {s.number: s for s in steps}
    ordered = [by_number[r.expectation.rung.order] for r in choice.ranked]
    if c.auto and choice.method == "written-order":
        tiers = ", ".join(dict.fromkeys(str(s.tier) for s in steps))
        choice = replace(choice, note=f"ladder: auto ({tiers} in each zone); {choice.note}")
    if choice.method == "cost" and reservation != "list" and any(str(s.tier) == "reservation" for s in steps):
        how = "the spot price, its opportunity cost" if reservation == "opportunity" else "nothing"
        choice = replace(choice, note=f"{choice.note}; a reservation is paid whether used or not, so it is "
                         f"charged at {how}")  # fmt: skip
    if choice.method == "cost" and scarcity and any(r.expectation.belief.full > 0 for r in choice.ranked):
        choice = replace(choice, note=f"{choice.note}; a rung the fleet finds full also costs, per hour held, "
                         "the share of requests it refuses x (on-demand - its price)")  # fmt: skip
    return ordered, choice


def plan_document(spec: ProvisionSpec, choice: Choice, run: RunModel, table: PriceTable) -> dict[str, Any]:
    """The plan as a run artifact: each rung's expected $ per kept step, completion and why."""
    return {
        "accelerator_type": spec.slice.accelerator_type,
        "backend": backend_of(spec),
        "steps_left": run.steps,
        "seconds_per_step": run.seconds_per_step,
        "checkpoint_every": run.checkpoint_every,
        "deadline_s": run.deadline_s,
        "price_date": table.date,
        **choice.to_json(),
    }


def plan_rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Table rows of a plan document (as kept in the ledger and ``plan.json``), in the order tried."""

    def num(v: Any, fmt: str, unit: str = "") -> str:
        return "never" if v is None else format(v, fmt) + unit

    return [
        {
            "#": r["position"],
            "rung": f"{('reservation ' + r['reservation']) if r['reservation'] else r['tier']} in {r['zone']}",
            "$/kept step": num(r["usd_per_step"], ".6f"),
            "completion (h)": num(None if r["wall_s"] is None else r["wall_s"] / 3600, ".2f"),
            "P(miss)": f"{r['miss_probability']:.1%}",
            "preempt/h": f"{r['rate_per_hour']:.3f} ({r['history_hours']:.1f} h seen)",
            "full": f"{r.get('full', 0.0):.0%}",  # plans kept before scarcity have none
            "why": r["why"],
        }
        for r in doc["rungs"]
    ]


def describe(choice: Choice) -> str:
    """The plan in a few lines (CLI and logs)."""
    lines = [choice.note]
    for row in plan_rows(choice.to_json()):
        lines.append(
            f"  {row['#']}. {row['rung']}: ${row['$/kept step']}/kept step, done in {row['completion (h)']} h, "
            f"P(miss) {row['P(miss)']}, {row['preempt/h']} preemptions/h — {row['why']}"
        )
    return "\n".join(lines)


def history_for(
    spec: ProvisionSpec, clients: Clients, now: float | None = None, *, strict: bool = False
) -> dict[Key, History]:
    """The capacity history under ``choose.history`` (read with the run's ``clients``): empty without
    one, or when it cannot be read (unless ``strict``: the CLI says why rather than show a plan
    without history)."""
    return weigh(spec, summary_for(spec, clients, strict=strict), now)


def summary_for(spec: ProvisionSpec, clients: Clients, *, strict: bool = False) -> dict[str, Any] | None:
    """The capacity summary under ``choose.history``; None without one or when it cannot be read."""
    c = spec.choose
    if c is None or c.history is None:
        return None
    from tpu_ops.errors import TpuOpsError
    from tpu_ops.provision import history
    from tpu_ops.uris import parse_gs

    try:
        return history.load_doc(clients.gcs(), parse_gs(c.history))
    except TpuOpsError:
        if strict:
            raise
        return None  # no history is no reason to refuse a slice: the written order stands, and says so


def weigh(spec: ProvisionSpec, doc: dict[str, Any] | None, now: float | None = None) -> dict[Key, History]:
    """The summary's history as the ranking reads it: forgetting by default (recent evidence weighs more,
    a rung whose rate changed starts again; ``choose.half_life`` if set)."""
    if doc is None or spec.choose is None:
        return {}
    from tpu_ops.provision import forgetting

    c = spec.choose
    half_life = c.half_life.total_seconds() if c.half_life is not None else None
    weighed, _ = forgetting.weigh(forgetting.summary_entries(doc), time.time() if now is None else now, half_life)
    return weighed


def write_plan(spec: ProvisionSpec, clients: Clients, run_id: str, doc: dict[str, Any]) -> None:
    """Keep the plan beside the run's records (``RUN/_tpu_ops/plan.json``) when the run has a bucket."""
    c = spec.choose
    if c is None or c.history is None:
        return
    from tpu_ops.cloud.translate import google_errors
    from tpu_ops.layout import RunLayout

    target = RunLayout.of(c.history, run_id).plan
    with google_errors("gcs"):
        clients.gcs().bucket(target.bucket).blob(target.prefix).upload_from_string(
            json.dumps(doc, sort_keys=True, default=str), content_type="application/json"
        )


def for_job(provision: ProvisionSpec, *, steps: int, checkpoint_every: int, checkpoint_dir: str,
            max_duration_s: float) -> ProvisionSpec:  # fmt: skip
    """A training job's provision spec with ``choose`` completed from the job (steps, checkpoint
    interval, history = the checkpoint dir, deadline = ``train.max_duration`` unless set)."""
    c = provision.choose
    if c is None:
        return provision
    from datetime import timedelta

    update: dict[str, Any] = {
        "steps": c.steps or steps,
        "checkpoint_every": c.checkpoint_every or checkpoint_every,
        "history": c.history or checkpoint_dir,
    }
    if c.max_duration is None and c.finish_by is None:
        update["max_duration"] = timedelta(seconds=max_duration_s)
    return provision.model_copy(update={"choose": c.model_copy(update=update)})


def keep_ask(spec: ProvisionSpec, clients: Any, run_id: str, choice: Choice, view: View | None, now: float) -> None:
    """After a ranking by cost with a fleet view, the run's ask for the reservation (its gain) in its capacity
    summary entry: the bar :func:`tpu_ops.provision.fleet.admit` sets for the last free VM is the median of
    the fleet's asks, running runs' included. A write that fails is skipped, never this run's slice."""
    if view is None or choice.method != "cost" or spec.choose is None or spec.choose.history is None:
        return
    from tpu_ops.errors import TpuOpsError
    from tpu_ops.provision import fleet, history
    from tpu_ops.uris import parse_gs

    with contextlib.suppress(TpuOpsError):
        history.note_ask(clients.gcs(), parse_gs(spec.choose.history), run_id, fleet.ask(fleet.gain(choice), now))


def apply(
    spec: ProvisionSpec,
    steps: Sequence[Any],
    clients: Clients,
    run_id: str,
    ledger: Any,
    table: PriceTable,
    progress: Progress | None = None,
    now: float | None = None,
    read: ReadReservation | None = None,
) -> tuple[list[Any], Choice | None]:
    """What the ladder calls at each walk: the attempts ranked (and the choice: how many to try
    before waiting, with ``choose.wait``), the plan kept in the ledger (a ``choice`` event) and beside
    the run's records in GCS. The deadline counts from the run's first ledger event, so a walk after
    a preemption ranks with the time then left. ``read``: a reservation's ``reservations.get`` (the
    provider's ``reservation_document``), for the fleet view (:func:`view_for`); None: no view."""
    if spec.choose is None:
        return list(steps), None
    from tpu_ops.errors import TpuOpsError

    now = time.time() if now is None else now
    started = min((float(e["t"]) for e in ledger.events() if "t" in e), default=now)
    done = (progress() if progress is not None else None) or 0
    run = run_model(spec, steps_done=done, started_at=started, now=now)
    summary = summary_for(spec, clients)
    view = view_for(steps, summary, read)
    ordered, choice = order(spec, steps, table, weigh(spec, summary, now), run, view=view, queue=True)
    keep_ask(spec, clients, run_id, choice, view, now)
    doc = plan_document(spec, choice, run, table)
    ledger.append(CHOICE_EVENT, plan=doc)
    # The ledger has it; a bucket we cannot write to is no reason to refuse a slice.
    with contextlib.suppress(TpuOpsError):
        write_plan(spec, clients, run_id, doc)
    return ordered, choice
