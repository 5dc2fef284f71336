"""``tpu-ops doctor`` on a spec with a calendar rung: the future reservation must exist, be in calendar
mode and not have ended (and the fix never books one silently: booking commits money)."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from flows.commands.dryrun import COMPUTE_CAPACITY, COMPUTE_SPEC
from infra.local.seed import seed_pipeline
from tpu_ops.doctor import MISSING, OK, run_checks
from tpu_ops.specs import PipelineSpec, load_spec
from tpu_ops.specs.slice import Rung
from tpu_ops.tiers import Tier


def _with_calendar_rung(stack: Any, name: str, calendar_chips: int | None = None) -> tuple[Any, Any, str]:
    """The dry run's pipeline with a calendar rung ``name`` first, seeded; (settings, spec, zone)."""
    spec = load_spec(COMPUTE_SPEC, PipelineSpec)
    zone = spec.provision.slice.zones[0]
    ladder = [Rung(kind=Tier.CALENDAR, name=name, zone=zone), *spec.provision.ladder]
    spec = spec.model_copy(update={"provision": spec.provision.model_copy(update={"ladder": ladder})})
    settings = stack.settings()
    seed_pipeline(settings, spec)
    capacity = dict(COMPUTE_CAPACITY)
    if calendar_chips is not None:
        capacity[zone] = {**COMPUTE_CAPACITY.get(zone, {}), "CALENDAR": calendar_chips}
    stack.set_compute_capacity(capacity)
    return settings, spec, zone


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _book(stack: Any, settings: Any, zone: str, name: str, start: float, days: int) -> None:
    """A calendar-mode request for 4 ``ct5p-hightpu-4t`` VMs from ``start``, through the real client."""
    from google.cloud import compute_v1

    fr = compute_v1.FutureReservation(
        name=name, reservation_mode="CALENDAR",
        time_window=compute_v1.FutureReservationTimeWindow(start_time=_iso(start), end_time=_iso(start + days * 86400)),
        specific_sku_properties=compute_v1.FutureReservationSpecificSKUProperties(
            total_count=4, instance_properties=compute_v1.AllocationSpecificSKUAllocationReservedInstanceProperties(
                machine_type="ct5p-hightpu-4t")),
    )  # fmt: skip
    stack.compute_client("FutureReservationsClient").insert_unary(
        project=settings.gcp_project, zone=zone, future_reservation_resource=fr
    )


def test_doctor_checks_a_calendar_rungs_reservation(stack: Any) -> None:
    settings, spec, zone = _with_calendar_rung(stack, "week")
    label = f"calendar reservation week in {zone}"
    check = {c.name: c for c in run_checks(settings, spec)}[label]
    assert check.status == MISSING and check.detail == "not found"
    assert "it can be cancelled before it is provisioned, which spares its charges" in check.fix
    start = time.time() + 3600
    _book(stack, settings, zone, "week", start, 7)
    check = {c.name: c for c in run_checks(settings, spec)}[label]
    assert check.status == OK and _iso(start).replace("T", " ") in check.detail, check


def test_doctor_says_a_calendar_reservation_google_declined_cannot_serve(stack: Any) -> None:
    settings, spec, zone = _with_calendar_rung(stack, "full", calendar_chips=0)
    _book(stack, settings, zone, "full", time.time() + 3600, 1)
    check = {c.name: c for c in run_checks(settings, spec)}[f"calendar reservation full in {zone}"]
    assert check.status == MISSING, check
    assert "DECLINED: Google rejected the request" in check.detail and "another window" in check.fix
