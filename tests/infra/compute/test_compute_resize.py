"""Resize requests and calendar-mode future reservations on the fake, driven by google-cloud-compute.

Google's pages: "About resize requests in a MIG" (states, 10 min - 7 days, all at once, deleted at the
end of the run), "Create a future reservation request in calendar mode" (1-90 days, an auto-created
reservation during the window), "Delete a future reservation request in calendar mode" (deleted only
once cancelled or past its end time; cancelling: ``test_compute_calendar_capacity.py``).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from compute.helpers import PROJECT, REGION, ZONE
from google.api_core import exceptions as gexc
from google.api_core.client_options import ClientOptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import compute_v1

Op = compute_v1.Operation
RR = compute_v1.InstanceGroupManagerResizeRequest
HOUR = 3600


def _clients(fake) -> tuple[Any, Any]:
    kw: dict[str, Any] = {"credentials": AnonymousCredentials(), "client_options": ClientOptions(api_endpoint=fake.url)}
    return compute_v1.InstanceGroupManagerResizeRequestsClient(**kw), compute_v1.FutureReservationsClient(**kw)


def _group(fake, name: str, model: str, reservation: str = "", topology: str = "2x2x4") -> None:
    """A group of 0 hosts of ct5p-hightpu-4t over a ``model`` template, under a workload policy."""
    policy = compute_v1.ResourcePolicy(
        name=f"{name}-wp",
        workload_policy=compute_v1.ResourcePolicyWorkloadPolicy(type_="HIGH_THROUGHPUT", accelerator_topology=topology),
    )
    op = fake.policies.insert_unary(project=PROJECT, region=REGION, resource_policy_resource=policy)
    fake.region_ops.wait(project=PROJECT, region=REGION, operation=op.name)
    sched = compute_v1.Scheduling(provisioning_model=model, on_host_maintenance="TERMINATE",
                                  instance_termination_action="DELETE")  # fmt: skip
    if model == "FLEX_START":
        sched.max_run_duration = compute_v1.Duration(seconds=HOUR)
    props = compute_v1.InstanceProperties(machine_type="ct5p-hightpu-4t", scheduling=sched)
    if reservation:
        props.reservation_affinity = compute_v1.ReservationAffinity(
            consume_reservation_type="SPECIFIC_RESERVATION", key="compute.googleapis.com/reservation-name",
            values=[reservation])  # fmt: skip
    op = fake.templates.insert_unary(project=PROJECT, instance_template_resource=compute_v1.InstanceTemplate(
        name=f"{name}-tpl", properties=props))  # fmt: skip
    fake.global_ops.wait(project=PROJECT, operation=op.name)
    igm = compute_v1.InstanceGroupManager(
        name=name, base_instance_name=name, target_size=0,
        instance_template=f"projects/{PROJECT}/global/instanceTemplates/{name}-tpl",
        instance_lifecycle_policy=compute_v1.InstanceGroupManagerInstanceLifecyclePolicy(
            default_action_on_failure="DO_NOTHING"),
        resource_policies=compute_v1.InstanceGroupManagerResourcePolicies(
            workload_policy=f"projects/{PROJECT}/regions/{REGION}/resourcePolicies/{name}-wp"),
    )  # fmt: skip
    op = fake.groups.insert_unary(project=PROJECT, zone=ZONE, instance_group_manager_resource=igm)
    assert fake.zone_ops.wait(project=PROJECT, zone=ZONE, operation=op.name).status == Op.Status.DONE


def _resize(rrs, group: str, name: str = "rr", by: int = 4, run_s: int = HOUR) -> Op:
    body = RR(name=name, resize_by=by, requested_run_duration=compute_v1.Duration(seconds=run_s))
    return rrs.insert_unary(project=PROJECT, zone=ZONE, instance_group_manager=group,
                            instance_group_manager_resize_request_resource=body)  # fmt: skip


def _get(rrs, group: str, name: str = "rr") -> RR:
    return rrs.get(project=PROJECT, zone=ZONE, instance_group_manager=group, resize_request=name)


def _state(rrs, group: str, name: str = "rr") -> str:
    return _get(rrs, group, name).state


def _hosts(fake, group: str) -> list[compute_v1.Instance]:
    return [i for i in fake.instances.list(project=PROJECT, zone=ZONE) if i.name.startswith(group + "-")]


def test_flex_start_resize_request_all_at_once_then_deleted_at_the_end_of_its_run(fake):
    rrs, _ = _clients(fake)
    fake.backend.configure_capacity({ZONE: {"FLEX_START": 8}})  # 2 hosts' worth: 4 cannot be placed
    _group(fake, "fx", "FLEX_START")
    op = _resize(rrs, "fx")
    assert op.status == Op.Status.RUNNING  # Google: the insert runs while the request is CREATING
    assert _state(rrs, "fx") == "CREATING"
    assert fake.groups.get(project=PROJECT, zone=ZONE, instance_group_manager="fx").target_size == 4
    fake.clock.advance(1)
    fake.backend.tick()
    rr = _get(rrs, "fx")
    assert rr.state == "ACCEPTED"  # waiting for capacity is not a failure
    assert "ZONE_RESOURCE_POOL_EXHAUSTED" in rr.status.last_attempt.error.errors[0].code
    assert _hosts(fake, "fx") == []  # never part of the slice
    assert fake.zone_ops.get(project=PROJECT, zone=ZONE, operation=op.name).status == Op.Status.DONE
    fake.backend.configure_capacity({ZONE: {"FLEX_START": 16}})
    assert _state(rrs, "fx") == "SUCCEEDED"
    hosts = _hosts(fake, "fx")
    assert len(hosts) == 4 and {h.scheduling.max_run_duration.seconds for h in hosts} == {HOUR}
    with pytest.raises(gexc.BadRequest, match="only a request in state ACCEPTED"):
        rrs.cancel_unary(project=PROJECT, zone=ZONE, instance_group_manager="fx", resize_request="rr")
    fake.clock.advance(HOUR + 1)
    fake.backend.tick()
    assert _hosts(fake, "fx") == []  # the MIG deleted them at the end of the run duration
    assert fake.groups.get(project=PROJECT, zone=ZONE, instance_group_manager="fx").target_size == 0
    rrs.delete_unary(project=PROJECT, zone=ZONE, instance_group_manager="fx", resize_request="rr")
    assert list(rrs.list(project=PROJECT, zone=ZONE, instance_group_manager="fx")) == []


def test_cancel_only_while_accepted_and_delete_only_when_terminal(fake):
    rrs, _ = _clients(fake)
    fake.backend.configure_capacity({ZONE: {"FLEX_START": 0}})
    _group(fake, "fc", "FLEX_START")
    _resize(rrs, "fc")
    with pytest.raises(gexc.BadRequest, match="state CREATING"):
        rrs.cancel_unary(project=PROJECT, zone=ZONE, instance_group_manager="fc", resize_request="rr")
    fake.clock.advance(1)
    with pytest.raises(gexc.BadRequest, match="cancel it first"):
        rrs.delete_unary(project=PROJECT, zone=ZONE, instance_group_manager="fc", resize_request="rr")
    rrs.cancel_unary(project=PROJECT, zone=ZONE, instance_group_manager="fc", resize_request="rr")
    assert _state(rrs, "fc") == "CANCELLED"
    assert fake.groups.get(project=PROJECT, zone=ZONE, instance_group_manager="fc").target_size == 0
    rrs.delete_unary(project=PROJECT, zone=ZONE, instance_group_manager="fc", resize_request="rr")
    with pytest.raises(gexc.NotFound):
        _get(rrs, "fc")


@pytest.mark.parametrize(
    ("by", "run_s", "match"),
    [(4, 599, "between 10 minutes"), (4, 7 * 86400 + 1, "between 10 minutes"), (0, HOUR, "resizeBy"),
     (2, HOUR, "acceleratorTopology 2x2x4 needs 4 VMs")],
)  # fmt: skip
def test_resize_request_validation_is_googles_400(fake, by, run_s, match):
    rrs, _ = _clients(fake)
    _group(fake, "fv", "FLEX_START")
    with pytest.raises(gexc.BadRequest, match=match):
        _resize(rrs, "fv", by=by, run_s=run_s)
    assert fake.backend.state()["resize_requests"] == 0


def test_resize_request_refused_on_a_spot_template(fake):
    rrs, _ = _clients(fake)
    _group(fake, "fs", "SPOT")
    with pytest.raises(gexc.BadRequest, match="FLEX_START or RESERVATION_BOUND"):
        _resize(rrs, "fs")


def test_reservation_bound_request_fails_when_no_reservation_will_exist(fake):
    rrs, _ = _clients(fake)
    _group(fake, "fn", "RESERVATION_BOUND", reservation="nowhere")
    _resize(rrs, "fn")
    fake.clock.advance(1)
    fake.backend.tick()
    rr = _get(rrs, "fn")
    assert rr.state == "FAILED" and "nowhere" in rr.status.error.errors[0].message
    assert fake.groups.get(project=PROJECT, zone=ZONE, instance_group_manager="fn").target_size == 0


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def test_calendar_reservation_window_consumed_through_a_resize_request(fake):
    rrs, frs = _clients(fake)
    now = fake.clock.now()
    fr = compute_v1.FutureReservation(
        name="cal", reservation_mode="CALENDAR", reservation_name="cal-res",
        time_window=compute_v1.FutureReservationTimeWindow(start_time=_iso(now + 2 * HOUR),
                                                           end_time=_iso(now + 2 * HOUR + 86400)),
        aggregate_reservation=compute_v1.AllocationAggregateReservation(
            vm_family="VM_FAMILY_CLOUD_TPU_POD_SLICE_CT5P",
            reserved_resources=[compute_v1.AllocationAggregateReservationReservedResourceInfo(
                accelerator=compute_v1.AllocationAggregateReservationReservedResourceInfoAccelerator(
                    accelerator_count=16))]),
    )  # fmt: skip
    op = frs.insert_unary(project=PROJECT, zone=ZONE, future_reservation_resource=fr)
    assert op.status in (Op.Status.RUNNING, Op.Status.DONE) and not op.error.errors  # RUNNING first, as Google's
    got = frs.get(project=PROJECT, zone=ZONE, future_reservation="cal")
    assert (
        got.status.procurement_status in ("PENDING_APPROVAL", "APPROVED") and not got.status.auto_created_reservations
    )
    assert [f.name for _, s in frs.aggregated_list(project=PROJECT) for f in s.future_reservations] == ["cal"]
    with pytest.raises(gexc.BadRequest, match="only after it is cancelled or after its end time"):
        frs.delete_unary(project=PROJECT, zone=ZONE, future_reservation="cal")
    _group(fake, "fcal", "RESERVATION_BOUND", reservation="cal-res")
    _resize(rrs, "fcal", run_s=6 * HOUR)
    fake.clock.advance(60)
    fake.backend.tick()
    assert _state(rrs, "fcal") == "ACCEPTED" and _hosts(fake, "fcal") == []  # waits for the window
    fake.clock.advance(2 * HOUR)
    fake.backend.tick()
    got = frs.get(project=PROJECT, zone=ZONE, future_reservation="cal")
    assert got.status.procurement_status == "FULFILLED"
    assert got.status.auto_created_reservations[0].endswith("/reservations/cal-res")
    assert _state(rrs, "fcal") == "SUCCEEDED" and len(_hosts(fake, "fcal")) == 4
    res = fake.reservations.get(project=PROJECT, zone=ZONE, reservation="cal-res")
    assert res.specific_reservation.in_use_count == 4
    fake.clock.advance(86400)
    fake.backend.tick()
    assert _hosts(fake, "fcal") == []  # the reservation ended: its VMs are deleted with it
    with pytest.raises(gexc.NotFound):
        fake.reservations.get(project=PROJECT, zone=ZONE, reservation="cal-res")


@pytest.mark.parametrize(("hours", "match"), [(12, "1 to 90 days"), (91 * 24, "1 to 90 days")])
def test_calendar_window_length_is_validated(fake, hours, match):
    _, frs = _clients(fake)
    now = fake.clock.now()
    fr = compute_v1.FutureReservation(
        name="bad", reservation_mode="CALENDAR",
        time_window=compute_v1.FutureReservationTimeWindow(start_time=_iso(now + HOUR),
                                                           end_time=_iso(now + HOUR + hours * HOUR)),
        specific_sku_properties=compute_v1.FutureReservationSpecificSKUProperties(
            total_count=4, instance_properties=compute_v1.AllocationSpecificSKUAllocationReservedInstanceProperties(
                machine_type="ct5p-hightpu-4t")),
    )  # fmt: skip
    with pytest.raises(gexc.BadRequest, match=match):
        frs.insert_unary(project=PROJECT, zone=ZONE, future_reservation_resource=fr)
