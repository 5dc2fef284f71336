"""``tpu-ops capacity calendar --spec FILE``: the calendar-mode reservations a spec could use, and their windows.

Read-only: booking a calendar reservation commits money unless its owner cancels it in time (Google:
cancelling prevents the provisioning "and incurring charges for them"), so tpu-ops never books or
cancels one; it lists those in the spec's zones (name, window, status, chips) and says which fit the
spec's slice and which its ladder names (``calendar:NAME@ZONE`` rungs).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from flows.commands._common import shell_settings, show


def register(what: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    c = what.add_parser("calendar", help="Calendar-mode reservations in the spec's zones, their windows, and fit.")
    c.add_argument("--spec", required=True, metavar="FILE", help="a provision, train or pipeline spec")
    c.add_argument("--json", action="store_true", help="print JSON")
    c.set_defaults(handler=calendar)


def _table(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "(none)"
    width = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in rows[0]}
    lines = ["  ".join(c.ljust(w) for c, w in width.items()), "  ".join("-" * w for w in width.values())]
    return "\n".join(lines + ["  ".join(str(r[c]).ljust(w) for c, w in width.items()) for r in rows])


def _provision_spec(path: Path) -> Any:
    from tpu_ops.specs import ProvisionSpec
    from tpu_ops.specs.loader import parse_spec, read_document

    doc = read_document(path)
    if isinstance(doc, dict) and "provision" in doc:
        doc = doc["provision"]
    return parse_spec(ProvisionSpec, doc, what=str(path))


def calendar(args: argparse.Namespace) -> int:
    from tpu_ops.provision import calendar as cal
    from tpu_ops.provision.providers import for_backend
    from tpu_ops.tiers import Backend

    spec = _provision_spec(Path(args.spec))
    settings = shell_settings()
    provider = for_backend(Backend.COMPUTE, settings)
    windows = provider.calendar_windows(spec.slice.zones)  # type: ignore[attr-defined]
    rows = cal.rows(spec, windows)
    head = f"{spec.slice.accelerator_type} in {', '.join(spec.slice.zones)}: {len(rows)} calendar reservation(s)"
    show({"accelerator_type": spec.slice.accelerator_type, "zones": spec.slice.zones, "reservations": rows},
         args.json, f"{head}\n{_table(rows)}")  # fmt: skip
    return 0
