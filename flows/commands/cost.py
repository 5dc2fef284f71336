"""``tpu-ops cost``: what a slice costs — tiers compared, commitments, $ per million tokens, a run's ledger."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from flows.commands._common import shell_settings, show
from tpu_ops.errors import NotFoundError, SpecError, TpuOpsError


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    c = sub.add_parser(
        "cost",
        help="What a slice costs: tiers compared, commitments, $ per million tokens, a run's ledger.",
        description="Prices are $ per chip-hour (the shipped table, or --price / TPU_OPS_PRICE_TABLE). "
        "Chips come from the accelerator table: v5p-128 is 64 chips (its suffix counts TensorCores); "
        "pass --chips to price a chip count directly (128 chips x $8 = $1,024/hour).",
    )
    what = c.add_mutually_exclusive_group()
    what.add_argument("--accelerator", metavar="TYPE", help="e.g. v5p-128, v4-32, v5litepod-16")
    what.add_argument("--chips", type=int, help="a chip count (needs --generation or --price)")
    what.add_argument("--run", metavar="RUN_ID", help="the cost ledger of a run")
    what.add_argument(
        "--spec", metavar="FILE", help="the estimate of a provision, train job or pipeline spec against its budget"
    )
    c.add_argument("--generation", choices=["v4", "v5e", "v5p", "v6e"], help="price table row for --chips")
    c.add_argument("--price", type=float, metavar="USD", help="$ per chip-hour (overrides the table)")
    c.add_argument("--hours", type=float, default=1.0, help="hours of use (default 1)")
    c.add_argument(
        "--utilisation",
        type=float,
        help="busy fraction (0-1]: adds 1- and 3-year commitments, priced over their whole term (8,760 h a year)",
    )
    c.add_argument("--tokens-per-second", type=float, help="throughput of the slice: adds $ per million tokens")
    c.add_argument("--json", action="store_true", help="print JSON")
    c.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from tpu_ops.provision import cost as C
    from tpu_ops.provision.prices import load

    settings = shell_settings()
    table = load(settings)
    if args.run:
        return _run_ledger(args, settings, table)
    if args.spec:
        return _spec_estimate(args, table, C)
    return _what_if(args, table, C)


def _run_ledger(args: argparse.Namespace, settings: Any, table: Any) -> int:
    """The run's ledger here merged with the copy its supervisor publishes beside its state (``train.costs``):
    the same figure wherever it is asked, as ``status`` shows it."""
    from flows.commands._runs import find, gcs
    from tpu_ops.layout import check_run_id
    from tpu_ops.provision.ledger import Ledger
    from tpu_ops.train.costs import known

    ledger = Ledger(settings, check_run_id(args.run))
    try:
        layout = find(settings, args.run).layout  # where its published copy is, if it was launched or is in Prefect
    except SpecError:
        layout = None
    try:
        found = known(settings, args.run, table, gcs(settings) if layout is not None else None, layout)
    except TpuOpsError as exc:  # GCS out of reach: what this state directory knows, said so
        print(f"the copy of run {args.run}'s ledger in GCS not read ({exc}): this state directory's ledger only",
              file=sys.stderr)  # fmt: skip
        found = known(settings, args.run, table)
    if not ledger.path.exists() and found.as_of is None:
        missing = NotFoundError(f"no ledger found for run {args.run} at {ledger.path}", service="ledger")
        missing.fix = (
            "check the run id, and run where the run ran (or set TPU_OPS_STATE_DIR: a dry run keeps "
            "its state in .tpu-ops/dry-run/state)"
        )
        raise missing
    summary = found.cost.to_json()
    tiers = ", ".join(
        f"{t}: {h:.4f} chip-h ${summary['usd_by_tier'][t]:,.2f}" for t, h in summary["chip_hours_by_tier"].items()
    )
    text = f"run {args.run}: ${summary['usd_total']:,.2f} ({tiers or 'no slice billed'}); "
    text += f"open slices: {summary['open_slices']}"
    if found.published:  # events only its supervisor's machine recorded: how old that copy is
        summary["published_as_of"] = found.as_of
        text += f"; from the copy of its ledger its supervisor published {time.time() - (found.as_of or 0):.0f} s ago"
    show(summary, args.json, text)
    return 0


def _spec_estimate(args: argparse.Namespace, table: Any, C: Any) -> int:
    """The estimate of a spec that provisions (a provision, train job or pipeline spec) against its
    budget; exit 1 when over it (the run would be refused before any cloud call)."""
    from pathlib import Path

    from flows.commands.validate import declared_kind, looks_like, spec_class
    from tpu_ops.errors import BudgetError
    from tpu_ops.specs import ProvisionSpec, parse_spec
    from tpu_ops.specs.loader import read_document

    path = Path(args.spec)
    doc = read_document(path)
    kind = declared_kind(path) or looks_like(doc)
    if kind in ("pipeline", "train-job"):
        whole: Any = parse_spec(spec_class(kind), doc, what=str(path))
        spec, field = whole.provision, "provision.budget_usd"
    else:
        spec, field = parse_spec(ProvisionSpec, doc, what=str(path)), "budget_usd"
    est = C.estimate(spec, table)
    rows = [f"  {r.tier}{' ' + r.reservation if r.reservation else ''}: ${r.usd:,.2f}" for r in est.rungs]
    text = f"{est.accelerator_type} ({est.chips} chips) x {est.hours:g} h, prices of {est.price_date}:\n" + "\n".join(
        rows
    )
    text += f"\n  worst case ${est.worst_usd:,.2f}"
    out = {**est.to_json(), "budget_usd": float(spec.budget_usd), "over_budget": False}
    try:
        C.check_budget(spec, table, field)
    except BudgetError as exc:
        out.update(over_budget=True, fix=exc.fix)
        show(out, args.json, text + f"\n{C.budget_line(exc)}")
        return 1
    show(out, args.json, text + f"\n  within the budget ${float(spec.budget_usd):,.2f} ({field})")
    return 0


def _saves(usd: float, pct: float) -> str:
    if usd >= 0:
        return f"saves ${usd:,.0f} ({pct:.1f}%)"
    return f"costs ${-usd:,.0f} more ({-pct:.1f}%)"


def _what_if(args: argparse.Namespace, table: Any, C: Any) -> int:
    if args.accelerator:
        from tpu_ops.accelerators import lookup

        try:
            acc = lookup(args.accelerator)
        except KeyError as exc:
            raise SpecError(str(exc.args[0])) from None
        cores = acc.chips * acc.cores_per_chip
        chips, generation, what = acc.chips, acc.generation, f"{acc.name} ({acc.chips} chips, {cores} TensorCores)"
    elif args.chips:
        chips, generation, what = args.chips, args.generation, f"{args.chips} chips"
        if generation is None and args.price is None:
            raise SpecError("--chips needs --generation (to read the price table) or --price")
    else:
        raise SpecError("say what to price: --accelerator TYPE, --chips N, --run RUN_ID or --spec FILE")
    if args.hours <= 0:
        raise SpecError(f"--hours must be positive, not {args.hours}")
    out: dict[str, Any] = {"what": what, "chips": chips, "hours": args.hours, "price_date": table.date}
    lines = [f"{what} for {args.hours:g} h"]
    if args.price is not None:
        per_hour = C.hourly_usd(chips, args.price)
        out["tiers"] = {
            "given": {"usd_per_chip_hour": args.price, "usd_per_hour": per_hour, "usd": per_hour * args.hours}
        }
    else:
        out["tiers"] = C.compare_tiers(chips, args.hours, generation, table)
        lines[0] += f" (prices of {table.date}, {table.origin})"
    for tier, row in out["tiers"].items():
        lines.append(
            f"  {tier:<12} ${row['usd_per_chip_hour']:,.2f}/chip-h  ${row['usd_per_hour']:,.2f}/h  ${row['usd']:,.2f}"
        )
    if args.utilisation is not None:
        if generation is None:
            raise SpecError("commitment savings need --accelerator or --generation")
        quotes = [C.commitment_savings(chips, generation, args.utilisation, y, table) for y in (1, 3)]
        # A commitment is paid for every hour of its term, so its figures are for the whole term, not
        # for --hours like the rows above: each says so, in the text and in the JSON.
        out["commitments"] = [{**q.to_json(), "term_hours": C.HOURS_PER_YEAR * q.years} for q in quotes]
        lines.append(f"  commitments, for their whole term (not the {args.hours:g} h above), "
                     f"busy {args.utilisation:.0%} of it:")  # fmt: skip
        for q in quotes:
            lines.append(
                f"    {q.years}-year ({C.HOURS_PER_YEAR * q.years:,.0f} h): commitment ${q.commit_usd:,.0f} vs "
                f"on-demand for the busy hours ${q.on_demand_usd:,.0f} → {_saves(q.savings_usd, q.savings_pct)} "
                f"over the term; break-even at {q.break_even_utilisation:.0%} busy"
            )
    if args.tokens_per_second is not None:
        out["usd_per_million_tokens"] = {
            t: C.usd_per_million_tokens(row["usd_per_hour"], args.tokens_per_second) for t, row in out["tiers"].items()
        }
        for t, v in out["usd_per_million_tokens"].items():
            lines.append(f"  {t:<12} ${v:,.4f} per million tokens at {args.tokens_per_second:g} tokens/s")
    show(out, args.json, "\n".join(lines))
    return 0
