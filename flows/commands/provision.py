"""``tpu-ops provision | teardown | reap | cost``: slices through the capacity ladder, and what they cost.

Input is validated (spec file, run id, budget) before any cloud call; heavy imports stay in the
handlers so ``--help`` is instant.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import timedelta
from typing import Any

from tpu_ops.errors import SpecError


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "provision",
        help="Get a TPU slice through the capacity ladder (reservation → spot → on-demand, zone by zone).",
        description="Runs the provision-slice Prefect flow: budget check first, then one queued resource per "
        "attempt. Re-running with the same --run-id adopts the existing slice. The slice stays up until "
        "`tpu-ops teardown RUN_ID`.",
    )
    p.add_argument("--spec", required=True, metavar="FILE", help="a provision spec (YAML or JSON)")
    p.add_argument("--run-id", required=True, help="names every resource of the run (≤ 40 chars, [a-z0-9-])")
    p.add_argument("--json", action="store_true", help="print the slice as JSON")
    p.add_argument("--no-flow", action="store_true", help="call the library directly (no Prefect API needed)")
    p.set_defaults(handler=run_provision)

    t = sub.add_parser("teardown", help="Force-delete a run's queued resources and nodes; confirm they are gone.")
    t.add_argument("run_id", metavar="RUN_ID")
    t.add_argument("--zone", action="append", dest="zones", metavar="ZONE", help="only these zones (default: all)")
    t.add_argument("--json", action="store_true", help="print the report as JSON")
    t.set_defaults(handler=run_teardown)

    r = sub.add_parser(
        "reap",
        help="Delete tpu-ops slices whose run is finished, unknown, dead, or older than a TTL.",
        description="Lists nodes and queued resources labelled tpu-ops-managed=true, asks Prefect whether each "
        "run is live (flow runs tagged tpu-ops-run:<id>), checks the ledger for a dead local owner, and "
        "deletes the rest. Reports what was deleted and what it had cost.",
    )
    r.add_argument("--dry-run", action="store_true", help="report only, delete nothing")
    r.add_argument("--ttl", metavar="DURATION", help="also reap anything older than this (e.g. 12h, 3d)")
    r.add_argument("--zone", action="append", dest="zones", metavar="ZONE", help="only these zones (default: all)")
    r.add_argument("--no-prefect", action="store_true", help="do not ask Prefect; only TTL and dead owners count")
    r.add_argument("--json", action="store_true", help="print the report as JSON")
    r.set_defaults(handler=run_reap)

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
    what.add_argument("--spec", metavar="FILE", help="the budget estimate of a provision spec")
    c.add_argument("--generation", choices=["v4", "v5e", "v5p", "v6e"], help="price table row for --chips")
    c.add_argument("--price", type=float, metavar="USD", help="$ per chip-hour (overrides the table)")
    c.add_argument("--hours", type=float, default=1.0, help="hours of use (default 1)")
    c.add_argument("--utilisation", type=float, help="busy fraction (0-1]: adds 1- and 3-year commitment savings")
    c.add_argument("--tokens-per-second", type=float, help="throughput of the slice: adds $ per million tokens")
    c.add_argument("--json", action="store_true", help="print JSON")
    c.set_defaults(handler=run_cost)


def _settings() -> Any:
    from flows.settings import resolve_settings

    return resolve_settings()


def _print(obj: dict[str, Any], as_json: bool, text: str) -> None:
    print(json.dumps(obj, indent=2, default=str) if as_json else text)


# -- provision / teardown ----------------------------------------------------------------------


def run_provision(args: argparse.Namespace) -> int:
    from tpu_ops.provision.cost import check_budget
    from tpu_ops.provision.naming import check_run_id
    from tpu_ops.provision.prices import load
    from tpu_ops.specs import ProvisionSpec, load_spec

    spec = load_spec(args.spec, ProvisionSpec)
    run_id = check_run_id(args.run_id)
    settings = _settings()
    check_budget(spec, load(settings))  # refuse before starting Prefect or calling the cloud
    if args.no_flow:
        from tpu_ops.provision import provision
        from tpu_ops.provision.ledger import Ledger

        result = provision(spec, run_id, settings).to_json()
        Ledger(settings, run_id).hand_off(result["queued_resource"])
    else:
        from prefect import tags

        from flows.provision import provision_slice, run_tag

        with tags(run_tag(run_id)):
            result = provision_slice(spec, run_id)
    text = (
        f"run {run_id}: {result['accelerator_type']} on {result['tier']} in {result['zone']} — queued resource "
        f"{result['queued_resource']}, node {result['node']}, {result['hosts']} hosts "
        f"({len(result['attempts'])} attempt(s))"
    )
    _print(result, args.json, text)
    return 0


def run_teardown(args: argparse.Namespace) -> int:
    from tpu_ops.provision import teardown

    report = teardown(args.run_id, _settings(), zones=args.zones)
    names = ", ".join(f"{r.kind} {r.resource_id} ({r.zone})" for r in report.deleted) or "nothing to delete"
    _print(report.to_json(), args.json, f"run {args.run_id}: {names}; confirmed gone in {report.seconds:.1f}s")
    return 0


# -- reap ---------------------------------------------------------------------------------------


def run_reap(args: argparse.Namespace) -> int:
    from tpu_ops.specs.common import parse_duration

    ttl = None
    if args.ttl:
        ttl = parse_duration(args.ttl)
        if not isinstance(ttl, timedelta) or ttl.total_seconds() <= 0:
            raise SpecError(f"--ttl {args.ttl!r} is not a duration like 90m, 12h or 3d")
    from flows.reaper import reap_once

    report = reap_once(dry_run=args.dry_run, ttl=ttl, zones=args.zones, use_prefect=not args.no_prefect)
    lines = []
    for r in report.reaped:
        verb = "would delete" if report.dry_run else ("deleted" if r.deleted else f"FAILED ({r.error})")
        items = ", ".join(f"{x.kind} {x.resource_id}" for x in r.resources)
        lines.append(f"{verb} run {r.run_id} — {r.reason}: {items}; age {r.age_hours:.2f} h, cost ~${r.cost_usd:,.2f}")
    lines.append(f"{len(report.reaped)} run(s) reaped, {len(report.kept)} kept; ~${report.cost_usd:,.2f} in total")
    _print(report.to_json(), args.json, "\n".join(lines))
    return 1 if any(r.error for r in report.reaped) else 0


# -- cost ---------------------------------------------------------------------------------------


def run_cost(args: argparse.Namespace) -> int:
    from tpu_ops.provision import cost as C
    from tpu_ops.provision.prices import load

    settings = _settings()
    table = load(settings)
    if args.run:
        from tpu_ops.provision.ledger import Ledger
        from tpu_ops.provision.naming import check_run_id

        summary = Ledger(settings, check_run_id(args.run)).summary(table).to_json()
        tiers = ", ".join(
            f"{t}: {h:.4f} chip-h ${summary['usd_by_tier'][t]:,.2f}" for t, h in summary["chip_hours_by_tier"].items()
        )
        text = f"run {args.run}: ${summary['usd_total']:,.2f} ({tiers or 'no slice billed'}); "
        text += f"open slices: {summary['open_slices']}"
        _print(summary, args.json, text)
        return 0
    if args.spec:
        from tpu_ops.specs import ProvisionSpec, load_spec

        est = C.estimate(load_spec(args.spec, ProvisionSpec), table)
        rows = [f"  {r.tier}{' ' + r.reservation if r.reservation else ''}: ${r.usd:,.2f}" for r in est.rungs]
        text = (
            f"{est.accelerator_type} ({est.chips} chips) x {est.hours:g} h, prices of {est.price_date}:\n"
            + "\n".join(rows)
        )
        _print(est.to_json(), args.json, text + f"\n  worst case ${est.worst_usd:,.2f}")
        return 0
    return _what_if(args, table, C)


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
        out["commitments"] = [q.to_json() for q in quotes]
        for q in quotes:
            lines.append(
                f"  {q.years}-year commitment at {q.utilisation:.0%} utilisation: ${q.commit_usd:,.0f} vs on-demand "
                f"${q.on_demand_usd:,.0f} → {_saves(q.savings_usd, q.savings_pct)}; "
                f"break-even at {q.break_even_utilisation:.0%}"
            )
    if args.tokens_per_second is not None:
        out["usd_per_million_tokens"] = {
            t: C.usd_per_million_tokens(row["usd_per_hour"], args.tokens_per_second) for t, row in out["tiers"].items()
        }
        for t, v in out["usd_per_million_tokens"].items():
            lines.append(f"  {t:<12} ${v:,.4f} per million tokens at {args.tokens_per_second:g} tokens/s")
    _print(out, args.json, "\n".join(lines))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(0)
