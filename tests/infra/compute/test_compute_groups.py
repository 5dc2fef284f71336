"""A multi-host slice as Compute Engine builds it: workload policy + template + group, via the client."""

from __future__ import annotations

import pytest
from compute.helpers import PROJECT, REGION, ZONE
from google.api_core import exceptions as gexc
from google.cloud import compute_v1

Op = compute_v1.Operation
RUN = "run-32"


def _wait_zone(fake, op: Op) -> Op:
    return fake.zone_ops.wait(project=PROJECT, zone=ZONE, operation=op.name)


def _create_slice(fake, name: str = "s32", model: str = "SPOT", action: str = "DO_NOTHING") -> None:
    """v5p-32: 16 chips = 4 hosts of ct5p-hightpu-4t, topology 2x2x4; BULK where Google allows it
    (flex-start, reservation-bound), else a group that creates its VMs one by one (spot, on-demand)."""
    policy = compute_v1.ResourcePolicy(
        name=f"{name}-wp",
        workload_policy=compute_v1.ResourcePolicyWorkloadPolicy(type_="HIGH_THROUGHPUT", accelerator_topology="2x2x4"),
    )
    op = fake.policies.insert_unary(project=PROJECT, region=REGION, resource_policy_resource=policy)
    assert fake.region_ops.wait(project=PROJECT, region=REGION, operation=op.name).status == Op.Status.DONE
    template = compute_v1.InstanceTemplate(
        name=f"{name}-tpl",
        properties=compute_v1.InstanceProperties(
            machine_type="ct5p-hightpu-4t",
            labels={"tpu-ops-run": RUN},
            scheduling=compute_v1.Scheduling(
                provisioning_model=model, on_host_maintenance="TERMINATE", **_bounded(model)
            ),
            metadata=compute_v1.Metadata(items=[compute_v1.Items(key="startup-script", value="true")]),
        ),
    )
    op = fake.templates.insert_unary(project=PROJECT, instance_template_resource=template)
    assert fake.global_ops.wait(project=PROJECT, operation=op.name).status == Op.Status.DONE
    group = compute_v1.InstanceGroupManager(
        name=name,
        base_instance_name=name,
        instance_template=f"projects/{PROJECT}/global/instanceTemplates/{name}-tpl",
        target_size=4,
        target_size_policy=compute_v1.InstanceGroupManagerTargetSizePolicy(
            mode="BULK" if model in ("FLEX_START", "RESERVATION_BOUND") else "INDIVIDUAL"
        ),
        instance_lifecycle_policy=compute_v1.InstanceGroupManagerInstanceLifecyclePolicy(
            default_action_on_failure=action
        ),
        resource_policies=compute_v1.InstanceGroupManagerResourcePolicies(
            workload_policy=f"projects/{PROJECT}/regions/{REGION}/resourcePolicies/{name}-wp"
        ),
    )
    op = fake.groups.insert_unary(project=PROJECT, zone=ZONE, instance_group_manager_resource=group)
    op = _wait_zone(fake, op)
    assert op.status == Op.Status.DONE and not op.error.errors


def _bounded(model: str) -> dict:
    if model != "FLEX_START":
        return {}
    return {"max_run_duration": compute_v1.Duration(seconds=3600), "instance_termination_action": "DELETE"}


def _managed(fake, name: str = "s32") -> list[compute_v1.ManagedInstance]:
    return list(fake.groups.list_managed_instances(project=PROJECT, zone=ZONE, instance_group_manager=name))


def test_bulk_group_of_four_hosts_preempt_and_teardown_in_order(fake):
    _create_slice(fake)
    igm = fake.groups.get(project=PROJECT, zone=ZONE, instance_group_manager="s32")
    assert igm.status.is_stable and igm.target_size == 4 and igm.current_actions.none == 4
    assert [(t.accelerator_topology, t.state) for t in igm.status.applied_accelerator_topologies] == [
        ("2x2x4", "ACTIVE")
    ]
    managed = _managed(fake)
    assert len(managed) == 4 and {m.instance_status for m in managed} == {"RUNNING"}
    listed = fake.instances.list(
        request=compute_v1.ListInstancesRequest(project=PROJECT, zone=ZONE, filter=f'labels.tpu-ops-run = "{RUN}"')
    )
    names = sorted(i.name for i in listed)
    assert len(names) == 4 and all(n.startswith("s32-") for n in names)
    assert sorted(m.name for m in managed) == names
    assert fake.backend.state()["chips_in_use"] == {ZONE: {"SPOT": 16}}

    fake.backend.preempt(ZONE, names[2])  # one host of a multi-host slice: the whole slice goes
    flt = 'operationType = "compute.instances.preempted"'
    ops = list(fake.zone_ops.list(request=compute_v1.ListZoneOperationsRequest(project=PROJECT, zone=ZONE, filter=flt)))
    assert sorted(o.target_link.rsplit("/", 1)[1] for o in ops) == names
    fake.clock.advance(30)
    fake.backend.tick()
    status = {m.name: m.instance_status for m in _managed(fake)}
    assert set(status.values()) == {"TERMINATED"}  # DO_NOTHING: no repair
    igm = fake.groups.get(project=PROJECT, zone=ZONE, instance_group_manager="s32")
    assert igm.status.applied_accelerator_topologies[0].state == "INCOMPLETE"

    # A template or policy in use cannot go first.
    with pytest.raises(gexc.BadRequest, match="already being used"):
        fake.templates.delete_unary(project=PROJECT, instance_template="s32-tpl")
    op = fake.groups.delete_unary(project=PROJECT, zone=ZONE, instance_group_manager="s32")
    assert _wait_zone(fake, op).status == Op.Status.DONE
    op = fake.templates.delete_unary(project=PROJECT, instance_template="s32-tpl")
    assert fake.global_ops.wait(project=PROJECT, operation=op.name).status == Op.Status.DONE
    op = fake.policies.delete_unary(project=PROJECT, region=REGION, resource_policy="s32-wp")
    assert fake.region_ops.wait(project=PROJECT, region=REGION, operation=op.name).status == Op.Status.DONE
    for get in (
        lambda: fake.groups.get(project=PROJECT, zone=ZONE, instance_group_manager="s32"),
        lambda: fake.templates.get(project=PROJECT, instance_template="s32-tpl"),
        lambda: fake.policies.get(project=PROJECT, region=REGION, resource_policy="s32-wp"),
    ):
        with pytest.raises(gexc.NotFound):
            get()
    assert list(fake.instances.list(project=PROJECT, zone=ZONE)) == []
    state = fake.backend.state()
    assert (state["instances"], state["instance_group_managers"], state["instance_templates"]) == (0, 0, 0)
    assert state["resource_policies"] == 0


def test_bulk_creates_no_vm_until_all_fit(fake):
    fake.backend.configure_capacity({ZONE: {"FLEX_START": 12}})  # 3 of the 4 hosts
    _create_slice(fake, model="FLEX_START")
    # As Google lists them while a BULK group waits: named managed instances, CREATING, no VM behind them.
    waiting = _managed(fake)
    assert [(m.current_action, m.instance_status, m.id) for m in waiting] == [("CREATING", "", 0)] * 4
    assert {m.version.instance_template.rsplit("/", 1)[1] for m in waiting} == {"s32-tpl"}
    assert {m.last_attempt.errors.errors[0].code for m in waiting} == {"ZONE_RESOURCE_POOL_EXHAUSTED"}
    assert [m.name for m in _managed(fake)] == [m.name for m in waiting]  # the names hold while it waits
    igm = fake.groups.get(project=PROJECT, zone=ZONE, instance_group_manager="s32")
    bulk = igm.status.bulk_instance_operation
    assert bulk.in_progress and not igm.status.is_stable and igm.current_actions.creating == 4
    assert [e.code for e in bulk.last_progress_check.error.errors] == ["ZONE_RESOURCE_POOL_EXHAUSTED"]
    assert fake.backend.state()["instances"] == 0

    fake.backend.configure_capacity({ZONE: {"FLEX_START": 16}})
    igm = fake.groups.get(project=PROJECT, zone=ZONE, instance_group_manager="s32")
    assert igm.status.is_stable and not igm.status.bulk_instance_operation.in_progress
    assert {m.instance_status for m in _managed(fake)} == {"RUNNING"} and len(_managed(fake)) == 4
    assert sorted(m.name for m in _managed(fake)) == sorted(m.name for m in waiting)  # the VMs get those names


def test_repair_recreates_a_preempted_member(fake):
    _create_slice(fake, action="REPAIR")
    before = {m.name: m.id for m in _managed(fake)}
    victim = sorted(before)[0]
    fake.backend.preempt(ZONE, victim)
    fake.clock.advance(30)
    fake.backend.tick()
    after = {m.name: (m.id, m.instance_status) for m in _managed(fake)}
    # the whole slice was preempted with its host, and is recreated whole: four new VMs (by id: a new VM's
    # name is drawn at random and may repeat a deleted one's, as Google's repair keeps names)
    assert len(after) == 4 and not set(before.values()) & {i for i, _ in after.values()}
    assert {s for _, s in after.values()} == {"RUNNING"}


def test_group_input_is_checked(fake):
    _create_slice(fake)
    bad = compute_v1.InstanceGroupManager(
        name="s-bad",
        instance_template=f"projects/{PROJECT}/global/instanceTemplates/s32-tpl",
        target_size=3,
        resource_policies=compute_v1.InstanceGroupManagerResourcePolicies(
            workload_policy=f"projects/{PROJECT}/regions/{REGION}/resourcePolicies/s32-wp"
        ),
    )
    with pytest.raises(gexc.BadRequest, match=r"targetSize.*2x2x4 needs 4 VMs"):
        fake.groups.insert_unary(project=PROJECT, zone=ZONE, instance_group_manager_resource=bad)
    bad.target_size, bad.instance_template = 4, f"projects/{PROJECT}/global/instanceTemplates/missing"
    with pytest.raises(gexc.BadRequest, match="instanceTemplate"):
        fake.groups.insert_unary(project=PROJECT, zone=ZONE, instance_group_manager_resource=bad)


def test_regional_templates(fake):
    template = compute_v1.InstanceTemplate(
        name="rt", properties=compute_v1.InstanceProperties(machine_type="tpu7x-standard-4t")
    )
    op = fake.region_templates.insert_unary(project=PROJECT, region=REGION, instance_template_resource=template)
    assert fake.region_ops.wait(project=PROJECT, region=REGION, operation=op.name).status == Op.Status.DONE
    got = fake.region_templates.get(project=PROJECT, region=REGION, instance_template="rt")
    assert got.region.endswith(f"/regions/{REGION}") and got.properties.machine_type == "tpu7x-standard-4t"
    assert [t.name for t in fake.region_templates.list(project=PROJECT, region=REGION)] == ["rt"]
    assert list(fake.templates.list(project=PROJECT)) == []  # global templates are another collection


def test_aggregated_lists_find_every_part_of_a_slice(fake):
    """What a reaper walks: groups, templates and policies carry no labels, so it goes by name prefix."""
    _create_slice(fake)
    project = PROJECT
    igms = fake.groups.aggregated_list(request=compute_v1.AggregatedListInstanceGroupManagersRequest(
        project=project, filter="name eq s32.*"))  # fmt: skip
    assert {scope: [g.name for g in scoped.instance_group_managers] for scope, scoped in igms} == {
        f"zones/{ZONE}": ["s32"]
    }
    tpls = fake.templates.aggregated_list(request=compute_v1.AggregatedListInstanceTemplatesRequest(project=project))
    assert {scope: [t.name for t in scoped.instance_templates] for scope, scoped in tpls} == {"global": ["s32-tpl"]}
    pols = fake.policies.aggregated_list(request=compute_v1.AggregatedListResourcePoliciesRequest(project=project))
    assert {scope: [p.name for p in scoped.resource_policies] for scope, scoped in pols} == {
        f"regions/{REGION}": ["s32-wp"]
    }


def test_a_member_deleted_by_hand_is_recreated_and_names_its_group(fake):
    _create_slice(fake)
    victim = sorted(m.name for m in _managed(fake))[0]
    vm = fake.instances.get(project=PROJECT, zone=ZONE, instance=victim)
    meta = {i.key: i.value for i in vm.metadata.items}
    assert meta["created-by"] == f"projects/{PROJECT}/zones/{ZONE}/instanceGroupManagers/s32"
    assert meta["instance-template"].endswith("/global/instanceTemplates/s32-tpl") and "startup-script" in meta
    op = fake.instances.delete_unary(project=PROJECT, zone=ZONE, instance=victim)
    assert _wait_zone(fake, op).status == Op.Status.DONE
    after = _managed(fake)
    assert len(after) == 4 and victim not in {m.name for m in after}  # the group keeps its target size
