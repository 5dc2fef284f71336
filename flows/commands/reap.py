"""``tpu-ops reap``: delete tpu-ops slices whose run is finished, unknown, dead or over a TTL."""

from __future__ import annotations

import argparse
from datetime import timedelta

from flows.commands._common import show
from tpu_ops.errors import SpecError


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    r = sub.add_parser(
        "reap",
        help="Delete tpu-ops slices whose run is finished, unknown, dead, or older than a TTL.",
        description="Lists Compute Engine instances and groups, and Cloud TPU nodes and queued resources, "
        "labelled tpu-ops-managed=true, asks Prefect whether each "
        "run is live (flow runs tagged tpu-ops-run:<id>), checks the ledger for a dead local owner, and "
        "deletes the rest. Reports what was deleted and what it had cost.",
    )
    r.add_argument("--dry-run", action="store_true", help="report only, delete nothing")
    r.add_argument("--ttl", metavar="DURATION", help="also reap anything older than this (e.g. 12h, 3d)")
    r.add_argument("--zone", action="append", dest="zones", metavar="ZONE", help="only these zones (default: all)")
    r.add_argument("--no-prefect", action="store_true", help="do not ask Prefect; only TTL and dead owners count")
    r.add_argument("--json", action="store_true", help="print the report as JSON")
    r.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from tpu_ops.specs.common import parse_duration

    ttl = None
    if args.ttl:
        try:
            ttl = parse_duration(args.ttl)
        except ValueError as exc:
            raise SpecError(f"--ttl: {exc}") from None
        if not isinstance(ttl, timedelta) or ttl.total_seconds() <= 0:
            raise SpecError(f"--ttl {args.ttl!r} is not a duration like 90m, 12h or 3d")
    from flows.reaper import reap_once

    report = reap_once(dry_run=args.dry_run, ttl=ttl, zones=args.zones, use_prefect=not args.no_prefect)
    from tpu_ops.text import human_duration

    lines = []
    for r in report.reaped:
        verb = "would delete" if report.dry_run else ("deleted" if r.deleted else f"FAILED ({r.error})")
        items = ", ".join(f"{x.kind} {x.resource_id}" for x in r.resources)
        lines.append(f"{verb} run {r.run_id} — {r.reason}: {items}; "
                     f"age {human_duration(r.age_hours * 3600)}, cost ~${r.cost_usd:,.2f}")  # fmt: skip
    if report.kept:
        lines.append(
            f"kept {len(report.kept)} run(s) still in use: {', '.join(report.kept)} (a live Prefect run, a live "
            "local owner, or a slice handed to you by `tpu-ops provision`; --ttl reaps them once old enough)"
        )
    n = len(report.reaped)
    if report.dry_run:
        lines.append(f"dry run: nothing deleted; {n} run(s) would be reaped (~${report.cost_usd:,.2f} so far)")
    else:
        deleted = sum(1 for r in report.reaped if r.deleted)
        lines.append(f"{deleted} of {n} run(s) reaped; ~${report.cost_usd:,.2f} in total")
    show(report.to_json(), args.json, "\n".join(lines))
    return 1 if any(r.error for r in report.reaped) else 0
