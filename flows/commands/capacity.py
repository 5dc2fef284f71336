"""``tpu-ops capacity``: what past runs saw of each rung, and how a spec's ladder would be ranked.

- ``capacity stats --history gs://BUCKET/PREFIX``: per (accelerator type, zone, tier, backend), the
  observed preemption rate and the hours it rests on, time to obtain a slice, recovery overhead and
  steps lost, folded from the run records under that checkpoint dir; beside them the hours as the
  ranking weighs them (recent runs more) and a change that reset a rung, if any.
- ``capacity plan --spec FILE``: the ladder's order for a provision, training or pipeline spec, each
  rung's expected $ per kept step, completion time, deadline miss probability and why it won or lost.
- ``capacity calendar --spec FILE``: the calendar-mode reservations a spec could use, and their windows
  (:mod:`flows.commands._capacity_calendar`).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from flows.commands._common import shell_settings, show


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    c = sub.add_parser(
        "capacity",
        help="Capacity history per zone and tier, and the ladder's cost-ranked plan.",
        description="History comes from the run records in the checkpoint bucket (RUN/_tpu_ops/), "
        "no database of its own; every supervised run adds to it.",
    )
    what = c.add_subparsers(dest="capacity_command", metavar="WHAT", required=True)
    s = what.add_parser("stats", help="Observed preemption rate, obtain time, recovery and steps lost per rung.")
    s.add_argument("--history", required=True, metavar="GS_URI", help="a checkpoint dir, gs://bucket/prefix")
    s.add_argument("--json", action="store_true", help="print JSON")
    s.set_defaults(handler=stats)
    p = what.add_parser("plan", help="Rank a spec's ladder by expected $ per kept step (no cloud call but GCS).")
    p.add_argument("--spec", required=True, metavar="FILE", help="a provision, train or pipeline spec")
    p.add_argument("--history", metavar="GS_URI", help="where past runs live (default: the spec's)")
    p.add_argument("--steps-done", type=int, default=0, help="steps already kept (re-ranking mid-run)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(handler=plan)
    from flows.commands import _capacity_calendar

    _capacity_calendar.register(what)


def _table(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "(none)"
    cols = list(rows[0])
    width = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in cols}
    lines = ["  ".join(c.ljust(width[c]) for c in cols), "  ".join("-" * width[c] for c in cols)]
    lines += ["  ".join(str(r[c]).ljust(width[c]) for c in cols) for r in rows]
    return "\n".join(lines)


def _num(v: Any, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def stats(args: argparse.Namespace) -> int:
    from tpu_ops.cloud.clients import Clients
    from tpu_ops.provision import history
    from tpu_ops.uris import parse_gs

    root = parse_gs(args.history)
    settings = shell_settings()
    runs = history.read_runs(Clients(settings).gcs(), root)
    rows = [s.to_json() for s in history.stats(history.fold((rec, ident) for _, rec, ident in runs))]
    _forgetting(rows, runs)
    table = [
        {
            "accelerator": r["accelerator_type"],
            "zone": r["zone"],
            "tier": r["tier"],
            "backend": r["backend"],
            "hours": f"{r['hours']:.2f}",
            "preemptions": r["preemptions"],
            "per hour": _num(r["preemptions_per_hour"], ".3f"),
            "obtain (s)": _num(r["obtain_s_mean"], ".1f"),
            "recovery (s)": _num(r["recovery_s_mean"], ".1f"),
            "steps lost": _num(r["steps_lost_mean"], ".1f"),
            "refused": _num(r["refused_share"], ".0%"),  # requests refused for capacity: how often full
            "weighted h": f"{r['weighted_hours']:.2f}",  # what the ranking reads: recent runs weigh more
            "change": _change(r["change"]),
        }
        for r in rows
    ]
    from tpu_ops.provision.fleet import holding

    # The fleet view: which slice each run holds now, from its run state (tpu_ops.provision.fleet).
    holds = {rid: h for rid, rec, _ in runs if (h := holding(rec)) is not None}
    text = f"{len(runs)} run(s) under {args.history}\n{_table(table)}"
    if holds:
        text += "\nholding now: " + ", ".join(f"{rid} {h['tier']} in {h['zone']}" for rid, h in sorted(holds.items()))
    show({"history": args.history, "runs": len(runs), "rungs": rows, "holding": holds}, args.json, text)
    return 0


def _forgetting(rows: list[dict[str, Any]], runs: list[tuple[str, dict[str, Any], Any]]) -> None:
    """Each row's hours as the ranking weighs them, and the change that reset it, if any
    (:mod:`tpu_ops.provision.forgetting`: forgetting by default)."""
    import time

    from tpu_ops.provision import forgetting, history

    entries = [forgetting.entry(history.entry(rec, ident)) for _, rec, ident in runs]  # as the summary has them
    weighed, changes = forgetting.weigh(entries, time.time())
    for r in rows:
        key = (r["accelerator_type"], r["zone"], r["tier"], r["backend"])
        r["weighted_hours"] = round(weighed[key].hours, 6) if key in weighed else 0.0
        r["change"] = changes[key].to_json() if key in changes else None


def _change(c: dict[str, Any] | None) -> str:
    if c is None:
        return "-"
    lo, hi = c["expected_interval"]
    return f"reset: {c['recent_preemptions']:g} in {c['recent_hours']:.1f} h, {lo}-{hi} expected"


def plan(args: argparse.Namespace) -> int:
    from tpu_ops.cloud.clients import Clients
    from tpu_ops.provision import ranking
    from tpu_ops.provision.ladder import plan as ladder_plan
    from tpu_ops.provision.prices import load as load_prices
    from tpu_ops.specs import ProvisionSpec
    from tpu_ops.specs.choose import ChooseSpec
    from tpu_ops.specs.jobs import TrainJobSpec
    from tpu_ops.specs.loader import parse_spec, read_document

    doc = read_document(Path(args.spec))
    if isinstance(doc, dict) and "train" in doc and "provision" in doc:
        job = parse_spec(TrainJobSpec, {k: doc[k] for k in ("train", "provision")}, what=args.spec)
        t = job.train
        # Without `choose` the job is planned as `choose: {by: cost}` would be, history included: its
        # own checkpoint dir, where `capacity stats` finds it.
        provision = job.provision if job.provision.choose else job.provision.model_copy(update={"choose": ChooseSpec()})
        spec = ranking.for_job(
            provision,
            steps=t.steps,
            checkpoint_every=t.checkpoint_every,
            checkpoint_dir=t.checkpoint_dir,
            max_duration_s=t.max_duration.total_seconds(),
        )
    else:
        spec = parse_spec(ProvisionSpec, doc, what=args.spec)
    # A ladder without `choose` is tried as written; the plan shows what `choose: {by: cost}` would make of it.
    choose = spec.choose or ChooseSpec()
    if args.history:
        choose = choose.model_copy(update={"history": args.history})
    spec = spec.model_copy(update={"choose": choose})
    settings = shell_settings()
    table = load_prices(settings)
    run = ranking.run_model(spec, steps_done=args.steps_done)
    found = ranking.history_for(spec, Clients(settings), strict=True)
    _, choice = ranking.order(spec, ladder_plan(spec), table, found, run)
    out = ranking.plan_document(spec, choice, run, table)
    text = f"{spec.slice.accelerator_type}: {ranking.describe(choice)}\n{_table(ranking.plan_rows(out))}"
    if choose.finish_by is not None and choose.finish_by.timestamp() <= time.time():  # else only P(miss) 100%
        past = f"choose.finish_by {choose.finish_by.isoformat()} has passed: every rung misses it; set a later time"
        out["note"] = f"{past}; {out['note']}" if out.get("note") else past
        text = f"note: {past}\n{text}"
    if spec.slice.shapes:  # elastic shapes: each one's expected $ per kept step (docs/elastic.md)
        from tpu_ops.provision.shapes import plan_shapes

        out["shapes"] = plan_shapes(spec, table, lambda s: ranking.history_for(s, Clients(settings)), args.steps_done)
        rows = [{**r, "usd_per_step": _num(r["usd_per_step"], ".6f"), "wall_s": _num(r["wall_s"], ".0f")}
                for r in out["shapes"]]  # fmt: skip
        text += f"\nshapes (target first; a smaller one accumulates, so its step is the target's):\n{_table(rows)}"
    show(out, args.json, text)
    return 0
