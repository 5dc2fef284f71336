"""``tpu-ops doctor`` on a spec with a calendar rung: the future reservation must exist, be in calendar
mode and not have ended (and the fix never books one silently: booking cannot be undone)."""

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


def test_doctor_checks_a_calendar_rungs_reservation(stack: Any) -> None:
    from google.cloud import compute_v1

    spec = load_spec(COMPUTE_SPEC, PipelineSpec)
    zone = spec.provision.slice.zones[0]
    ladder = [Rung(kind=Tier.CALENDAR, name="week", zone=zone), *spec.provision.ladder]
    spec = spec.model_copy(update={"provision": spec.provision.model_copy(update={"ladder": ladder})})
    settings = stack.settings()
    seed_pipeline(settings, spec)
    stack.set_compute_capacity(COMPUTE_CAPACITY)
    label = f"calendar reservation week in {zone}"
    check = {c.name: c for c in run_checks(settings, spec)}[label]
    assert check.status == MISSING and check.detail == "not found" and "cannot be cancelled" in check.fix

    start = time.time() + 3600

    def iso(t: float) -> str:
        return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

    fr = compute_v1.FutureReservation(
        name="week", reservation_mode="CALENDAR",
        time_window=compute_v1.FutureReservationTimeWindow(start_time=iso(start), end_time=iso(start + 7 * 86400)),
        specific_sku_properties=compute_v1.FutureReservationSpecificSKUProperties(
            total_count=4, instance_properties=compute_v1.AllocationSpecificSKUAllocationReservedInstanceProperties(
                machine_type="ct5p-hightpu-4t")),
    )  # fmt: skip
    stack.compute_client("FutureReservationsClient").insert_unary(
        project=settings.gcp_project, zone=zone, future_reservation_resource=fr
    )
    check = {c.name: c for c in run_checks(settings, spec)}[label]
    assert check.status == OK and iso(start).replace("T", " ") in check.detail, check


def test_doctor_says_a_calendar_reservation_google_declined_cannot_serve(stack: Any) -> None:
    from google.cloud import compute_v1

    spec = load_spec(COMPUTE_SPEC, PipelineSpec)
    zone = spec.provision.slice.zones[0]
    ladder = [Rung(kind=Tier.CALENDAR, name="full", zone=zone), *spec.provision.ladder]
    spec = spec.model_copy(update={"provision": spec.provision.model_copy(update={"ladder": ladder})})
    settings = stack.settings()
    seed_pipeline(settings, spec)
    stack.set_compute_capacity({**COMPUTE_CAPACITY, zone: {**COMPUTE_CAPACITY.get(zone, {}), "CALENDAR": 0}})
    start = time.time() + 3600

    def iso(t: float) -> str:
        return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

    fr = compute_v1.FutureReservation(
        name="full", reservation_mode="CALENDAR",
        time_window=compute_v1.FutureReservationTimeWindow(start_time=iso(start), end_time=iso(start + 86400)),
        specific_sku_properties=compute_v1.FutureReservationSpecificSKUProperties(
            total_count=4, instance_properties=compute_v1.AllocationSpecificSKUAllocationReservedInstanceProperties(
                machine_type="ct5p-hightpu-4t")),
    )  # fmt: skip
    stack.compute_client("FutureReservationsClient").insert_unary(
        project=settings.gcp_project, zone=zone, future_reservation_resource=fr
    )
    check = {c.name: c for c in run_checks(settings, spec)}[f"calendar reservation full in {zone}"]
    assert check.status == MISSING, check
    assert "DECLINED: Google rejected the request" in check.detail and "another window" in check.fix
