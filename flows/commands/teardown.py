"""``tpu-ops teardown RUN_ID``: delete a run's slices on every control plane; confirm they are gone."""

from __future__ import annotations

import argparse

from flows.commands._common import shell_settings, show

TEARDOWN = (
    "Delete a run's instances, groups, templates and workload policies (Compute Engine) and its "
    "queued resources and nodes (Cloud TPU API); confirm they are gone."
)


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    t = sub.add_parser(
        "teardown",
        help=TEARDOWN,
        description=TEARDOWN,
    )
    t.add_argument("run_id", metavar="RUN_ID")
    t.add_argument("--zone", action="append", dest="zones", metavar="ZONE", help="only these zones (default: all)")
    t.add_argument("--json", action="store_true", help="print the report as JSON")
    t.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from tpu_ops.provision import teardown

    report = teardown(args.run_id, shell_settings(), zones=args.zones)
    names = ", ".join(f"{r.kind} {r.resource_id} ({r.zone})" for r in report.deleted) or "nothing to delete"
    show(report.to_json(), args.json, f"run {args.run_id}: {names}; confirmed gone in {report.seconds:.1f}s")
    return 0
