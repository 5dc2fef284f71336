"""Operations as Google runs them: RUNNING first, DONE later, a failed one with ``error`` and
``httpErrorStatusCode``/``httpErrorMessage``; the control that fails the next one asynchronously;
BULK refused over SPOT and STANDARD templates; a group that is not BULK coming up partly."""

from __future__ import annotations

import json
import urllib.request

import pytest
from compute.helpers import PROJECT, ZONE
from google.api_core import exceptions as gexc
from google.cloud import compute_v1

Op = compute_v1.Operation


def _instance(name: str, model: str = "SPOT") -> compute_v1.Instance:
    return compute_v1.Instance(
        name=name,
        machine_type=f"zones/{ZONE}/machineTypes/ct6e-standard-8t",
        scheduling=compute_v1.Scheduling(provisioning_model=model, on_host_maintenance="TERMINATE"),
    )


def _zone_op(fake, name: str) -> Op:
    return fake.zone_ops.get(project=PROJECT, zone=ZONE, operation=name)


def _template(fake, name: str, model: str, **sched) -> None:
    tpl = compute_v1.InstanceTemplate(
        name=name,
        properties=compute_v1.InstanceProperties(
            machine_type="ct5p-hightpu-4t",
            scheduling=compute_v1.Scheduling(provisioning_model=model, on_host_maintenance="TERMINATE", **sched),
            reservation_affinity=compute_v1.ReservationAffinity(
                consume_reservation_type="SPECIFIC_RESERVATION", key="compute.googleapis.com/reservation-name",
                values=["res"]) if model == "RESERVATION_BOUND" else None,
        ),
    )  # fmt: skip
    op = fake.templates.insert_unary(project=PROJECT, instance_template_resource=tpl)
    assert fake.global_ops.wait(project=PROJECT, operation=op.name).status == Op.Status.DONE


def _group(template: str, mode: str | None, name: str = "g") -> compute_v1.InstanceGroupManager:
    igm = compute_v1.InstanceGroupManager(
        name=name, base_instance_name=name, target_size=4,
        instance_template=f"projects/{PROJECT}/global/instanceTemplates/{template}",
    )  # fmt: skip
    if mode:
        igm.target_size_policy = compute_v1.InstanceGroupManagerTargetSizePolicy(mode=mode)
    return igm


def test_an_insert_runs_then_ends(fake):
    op = fake.instances.insert_unary(project=PROJECT, zone=ZONE, instance_resource=_instance("vm"))
    assert op.status == Op.Status.RUNNING and op.progress == 0
    assert _zone_op(fake, op.name).status == Op.Status.RUNNING  # op_polls = 1: one read still RUNNING
    done = _zone_op(fake, op.name)
    assert done.status == Op.Status.DONE and not done.error.errors and done.end_time
    # a template's insert too, though the template exists at once
    tpl = compute_v1.InstanceTemplate(
        name="t", properties=compute_v1.InstanceProperties(machine_type="ct6e-standard-8t")
    )
    op = fake.templates.insert_unary(project=PROJECT, instance_template_resource=tpl)
    assert op.status == Op.Status.RUNNING
    assert fake.global_ops.get(project=PROJECT, operation=op.name).status == Op.Status.RUNNING
    assert fake.global_ops.get(project=PROJECT, operation=op.name).status == Op.Status.DONE


def test_an_operation_nobody_reads_ends_by_fake_time(fake):
    op = fake.instances.insert_unary(project=PROJECT, zone=ZONE, instance_resource=_instance("vm"))
    fake.clock.advance(fake.backend.op_s)
    fake.backend.tick()
    assert _zone_op(fake, op.name).status == Op.Status.DONE


def test_a_stockout_runs_then_fails_with_googles_fields(fake):
    fake.backend.configure_capacity({ZONE: {"SPOT": 0}})
    op = fake.instances.insert_unary(project=PROJECT, zone=ZONE, instance_resource=_instance("vm"))
    assert op.status == Op.Status.RUNNING and not op.error.errors
    assert _zone_op(fake, op.name).status == Op.Status.RUNNING
    done = _zone_op(fake, op.name)
    assert done.status == Op.Status.DONE
    assert [e.code for e in done.error.errors] == ["ZONE_RESOURCE_POOL_EXHAUSTED"]
    assert (done.http_error_status_code, done.http_error_message) == (503, "SERVICE UNAVAILABLE")
    with pytest.raises(gexc.NotFound):
        fake.instances.get(project=PROJECT, zone=ZONE, instance="vm")


def test_the_control_fails_the_next_insert_asynchronously_over_http(fake):
    body = {"collection": "instanceTemplates", "operationType": "insert", "error": "QUOTA_EXCEEDED"}
    req = urllib.request.Request(f"{fake.url}/_fake/operations:fail", data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert json.loads(resp.read()) == {"operation_faults_pending": 1}
    tpl = compute_v1.InstanceTemplate(
        name="t", properties=compute_v1.InstanceProperties(machine_type="ct6e-standard-8t")
    )
    op = fake.templates.insert_unary(project=PROJECT, instance_template_resource=tpl)
    assert op.status == Op.Status.RUNNING
    done = fake.global_ops.wait(project=PROJECT, operation=op.name)
    assert done.status == Op.Status.DONE and [e.code for e in done.error.errors] == ["QUOTA_EXCEEDED"]
    assert done.http_error_status_code == 403
    with pytest.raises(gexc.NotFound):  # a failed insert leaves nothing
        fake.templates.get(project=PROJECT, instance_template="t")
    # only the next one: the same insert now succeeds
    op = fake.templates.insert_unary(project=PROJECT, instance_template_resource=tpl)
    assert not fake.global_ops.wait(project=PROJECT, operation=op.name).error.errors


def test_a_delete_made_to_fail_leaves_the_resource(fake):
    op = fake.instances.insert_unary(project=PROJECT, zone=ZONE, instance_resource=_instance("vm"))
    fake.zone_ops.wait(project=PROJECT, zone=ZONE, operation=op.name)
    fake.backend.fail_operations("instances", "delete", "INTERNAL_ERROR")
    op = fake.instances.delete_unary(project=PROJECT, zone=ZONE, instance="vm")
    assert op.status == Op.Status.RUNNING
    done = fake.zone_ops.wait(project=PROJECT, zone=ZONE, operation=op.name)
    assert [e.code for e in done.error.errors] == ["INTERNAL_ERROR"] and done.http_error_status_code == 500
    assert fake.instances.get(project=PROJECT, zone=ZONE, instance="vm").status == "RUNNING"


def test_the_control_refuses_what_it_cannot_do(fake):
    from infra.local.core import exceptions as exc

    with pytest.raises(exc.InvalidArgument, match="collection"):
        fake.backend.fail_operations("disks", "insert")
    with pytest.raises(exc.InvalidArgument, match="error"):
        fake.backend.fail_operations("instances", "insert", "NOPE")


@pytest.mark.parametrize("model", ["SPOT", "STANDARD"])
def test_bulk_is_refused_over_a_spot_or_standard_template(fake, model):
    _template(fake, "t", model)
    with pytest.raises(gexc.BadRequest) as err:
        fake.groups.insert_unary(project=PROJECT, zone=ZONE, instance_group_manager_resource=_group("t", "BULK"))
    assert (
        "Bulk mode is only supported with instance templates that specify either a reservation-bound or "
        "flex-start provisioning model"
        in err.value.message
        and f"provisioningModel {model}" in err.value.message
    )
    assert fake.backend.state()["instance_group_managers"] == 0
    # the same group without BULK is what Google's TPU pages create for spot and on-demand
    op = fake.groups.insert_unary(project=PROJECT, zone=ZONE, instance_group_manager_resource=_group("t", None))
    assert not fake.zone_ops.wait(project=PROJECT, zone=ZONE, operation=op.name).error.errors


@pytest.mark.parametrize("model", ["RESERVATION_BOUND", "FLEX_START"])
def test_bulk_is_accepted_over_reservation_bound_and_flex_start(fake, model):
    fake.backend.configure_capacity({ZONE: {"reservations": {"res": {"count": 4, "machineType": "ct5p-hightpu-4t"}}}})
    extra = {"max_run_duration": compute_v1.Duration(seconds=3600)} if model == "FLEX_START" else {}
    _template(fake, "t", model, **extra)
    op = fake.groups.insert_unary(project=PROJECT, zone=ZONE, instance_group_manager_resource=_group("t", "BULK"))
    assert not fake.zone_ops.wait(project=PROJECT, zone=ZONE, operation=op.name).error.errors
    assert len(list(fake.groups.list_managed_instances(project=PROJECT, zone=ZONE, instance_group_manager="g"))) == 4


def test_a_group_that_is_not_bulk_comes_up_partly(fake):
    fake.backend.configure_capacity({ZONE: {"SPOT": 12}})  # capacity for 3 of the 4 hosts
    _template(fake, "t", "SPOT", instance_termination_action="STOP")
    fake.groups.insert_unary(project=PROJECT, zone=ZONE, instance_group_manager_resource=_group("t", None))
    managed = list(fake.groups.list_managed_instances(project=PROJECT, zone=ZONE, instance_group_manager="g"))
    assert [m.instance_status for m in managed] == ["RUNNING"] * 3 + [""]  # 3 billed, and useless as a slice
    creating = managed[3]
    assert creating.current_action == "CREATING" and creating.name.startswith("g-")
    assert [e.code for e in creating.last_attempt.errors.errors] == ["ZONE_RESOURCE_POOL_EXHAUSTED"]
    igm = fake.groups.get(project=PROJECT, zone=ZONE, instance_group_manager="g")
    assert igm.current_actions.creating == 1 and not igm.status.is_stable
    assert fake.backend.state()["chips_in_use"] == {ZONE: {"SPOT": 12}}
    fake.backend.configure_capacity({ZONE: {"SPOT": 16}})  # capacity comes back: the named VM is created
    managed = list(fake.groups.list_managed_instances(project=PROJECT, zone=ZONE, instance_group_manager="g"))
    assert [m.instance_status for m in managed] == ["RUNNING"] * 4 and creating.name in {m.name for m in managed}


def test_the_sdks_own_extended_operation_raises_on_the_fakes_stockout(fake):
    """With ``error`` alone (the fake's old answer) google-cloud-compute's ``ExtendedOperation.result()``
    returns None; with Google's ``httpErrorStatusCode``/``httpErrorMessage`` it raises. Its refresh is
    pointed at the fake (its own would ask Google's real host)."""
    import functools

    fake.backend.configure_capacity({ZONE: {"SPOT": 0}})
    op = fake.instances.insert(project=PROJECT, zone=ZONE, instance_resource=_instance("vm"))
    op._refresh = functools.partial(fake.zone_ops.get, project=PROJECT, zone=ZONE, operation=op.name)
    with pytest.raises(gexc.ServiceUnavailable, match="SERVICE UNAVAILABLE"):
        op.result(timeout=10)
