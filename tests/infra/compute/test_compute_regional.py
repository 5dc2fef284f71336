"""Regional managed instance groups through google-cloud-compute: the distribution policy Google
documents ("About bulk mode": a regional BULK group takes only ANY_SINGLE_ZONE), VMs in one zone of
the region, a regional slice preempted as a whole, deleted through a region operation."""

from __future__ import annotations

from typing import Any

import pytest
from compute.helpers import PROJECT, REGION, ZONE
from google.api_core import exceptions as gexc
from google.api_core.client_options import ClientOptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import compute_v1

Op = compute_v1.Operation
OTHER = "us-east5-b"


@pytest.fixture
def rgroups(fake) -> compute_v1.RegionInstanceGroupManagersClient:
    opts = ClientOptions(api_endpoint=fake.url)
    return compute_v1.RegionInstanceGroupManagersClient(credentials=AnonymousCredentials(), client_options=opts)


def _parts(fake, model: str) -> None:
    """A 2x2x4 workload policy and a v5p template (reservation-bound on ``res``, or ``model``)."""
    policy = compute_v1.ResourcePolicy(name="wp", workload_policy=compute_v1.ResourcePolicyWorkloadPolicy(
        type_="HIGH_THROUGHPUT", accelerator_topology="2x2x4"))  # fmt: skip
    fake.policies.insert_unary(project=PROJECT, region=REGION, resource_policy_resource=policy)
    extra: dict[str, Any] = {}
    if model == "RESERVATION_BOUND":
        extra["reservation_affinity"] = compute_v1.ReservationAffinity(
            consume_reservation_type="SPECIFIC_RESERVATION", key="compute.googleapis.com/reservation-name",
            values=["res"])  # fmt: skip
    props = compute_v1.InstanceProperties(machine_type="ct5p-hightpu-4t", scheduling=compute_v1.Scheduling(
        provisioning_model=model, on_host_maintenance="TERMINATE"), **extra)  # fmt: skip
    fake.templates.insert_unary(project=PROJECT, instance_template_resource=compute_v1.InstanceTemplate(
        name="tpl", properties=props))  # fmt: skip


def _group(name: str, shape: str | None, zones: list[str], bulk: bool = True) -> compute_v1.InstanceGroupManager:
    configs = [compute_v1.DistributionPolicyZoneConfiguration(zone=f"zones/{z}") for z in zones]
    dist = compute_v1.DistributionPolicy(zones=configs)
    if shape:
        dist.target_shape = shape
    kw: dict[str, Any] = {}
    if bulk:
        kw["target_size_policy"] = compute_v1.InstanceGroupManagerTargetSizePolicy(mode="BULK")
    return compute_v1.InstanceGroupManager(
        name=name, instance_template=f"projects/{PROJECT}/global/instanceTemplates/tpl", target_size=4,
        distribution_policy=dist, resource_policies=compute_v1.InstanceGroupManagerResourcePolicies(
            workload_policy=f"projects/{PROJECT}/regions/{REGION}/resourcePolicies/wp"), **kw)  # fmt: skip


def test_a_regional_bulk_group_takes_only_any_single_zone_and_its_region(fake, rgroups):
    _parts(fake, "STANDARD")
    for shape, zones, needle in [(None, [ZONE], "ANY_SINGLE_ZONE"), ("EVEN", [ZONE], "ANY_SINGLE_ZONE"),
                                 ("ANY_SINGLE_ZONE", ["us-central1-a"], "Zone must be in region")]:  # fmt: skip
        with pytest.raises(gexc.BadRequest, match=needle):
            rgroups.insert_unary(project=PROJECT, region=REGION, instance_group_manager_resource=_group(
                "g", shape, zones))  # fmt: skip
    with pytest.raises(gexc.NotFound, match="projects/proj/regions/us-east9"):
        rgroups.insert_unary(project=PROJECT, region="us-east9", instance_group_manager_resource=_group(
            "g", "ANY_SINGLE_ZONE", ["us-east9-a"]))  # fmt: skip
    assert fake.backend.state()["instance_group_managers"] == 0


def test_a_regional_bulk_group_goes_to_the_zone_with_room_for_all(fake, rgroups):
    fake.backend.configure_capacity({ZONE: {"reservations": {"res": {"count": 4, "machineType": "ct5p-hightpu-4t"}}}})
    _parts(fake, "RESERVATION_BOUND")
    op = rgroups.insert_unary(project=PROJECT, region=REGION, instance_group_manager_resource=_group(
        "rg", "ANY_SINGLE_ZONE", [OTHER, ZONE]))  # fmt: skip
    assert op.region.endswith(f"/regions/{REGION}") and op.status == Op.Status.RUNNING  # DONE later, as Google's
    assert fake.region_ops.wait(project=PROJECT, region=REGION, operation=op.name).status == Op.Status.DONE
    igm = rgroups.get(project=PROJECT, region=REGION, instance_group_manager="rg")
    assert igm.region.endswith(f"/regions/{REGION}")
    assert igm.self_link.endswith(f"/regions/{REGION}/instanceGroupManagers/rg")
    assert igm.distribution_policy.target_shape == "ANY_SINGLE_ZONE" and igm.status.is_stable
    members = list(rgroups.list_managed_instances(project=PROJECT, region=REGION, instance_group_manager="rg"))
    assert {m.instance.split("/zones/")[1].split("/")[0] for m in members} == {ZONE}  # where the reservation is
    assert [m.instance_status for m in members] == ["RUNNING"] * 4
    assert [g.name for g in rgroups.list(project=PROJECT, region=REGION)] == ["rg"]
    assert list(fake.groups.list(project=PROJECT, zone=ZONE)) == []  # a regional group is not a zone's


def test_a_regional_spot_slice_is_preempted_whole_and_deleted(fake, rgroups):
    _parts(fake, "SPOT")
    rgroups.insert_unary(project=PROJECT, region=REGION, instance_group_manager_resource=_group(
        "spot", "ANY_SINGLE_ZONE", [ZONE], bulk=False))  # fmt: skip
    members = list(rgroups.list_managed_instances(project=PROJECT, region=REGION, instance_group_manager="spot"))
    assert len(members) == 4
    fake.backend.preempt(ZONE, members[0].name)
    states = fake.backend.state()["instance_states"]
    assert set(states.values()) == {"STOPPING"}  # every host of the slice got the notice
    op = rgroups.delete_unary(project=PROJECT, region=REGION, instance_group_manager="spot")
    done = fake.region_ops.wait(project=PROJECT, region=REGION, operation=op.name)
    assert done.status == Op.Status.DONE and not done.error.errors
    assert fake.backend.state()["instance_group_managers"] == 0 and fake.backend.state()["instances"] == 0
