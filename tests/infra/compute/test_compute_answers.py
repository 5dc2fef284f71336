"""Every answer the fake Compute Engine gives in a representative session, driven through
google-cloud-compute (and raw HTTP where the client has no method), fits the ``compute.v1`` discovery
document: each reply is checked against the response schema of the discovery method its path and HTTP
method stand for (``compute.recorder``), with the output fields Google always sets present."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from compute.helpers import PROJECT, REGION, ZONE, loopback_only
from compute.recorder import Recorder, Reply, problems, schema_for
from google.api_core import exceptions as gexc
from google.api_core.client_options import ClientOptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import compute_v1

from infra.local.compute.models import ComputeBackend
from infra.local.compute.server import ComputeServer
from infra.local.core.clock import ManualClock

RES = {"consumeReservationType": "SPECIFIC_RESERVATION", "key": "compute.googleapis.com/reservation-name",
       "values": ["res"]}  # fmt: skip
CLIENTS = (
    "Instances", "InstanceTemplates", "ResourcePolicies", "InstanceGroupManagers", "RegionInstanceGroupManagers",
    "Reservations", "MachineTypes", "Images", "Autoscalers", "RegionAutoscalers", "InstanceGroups",
    "RegionInstanceGroups", "Zones", "Regions", "Projects", "ZoneOperations", "RegionOperations", "GlobalOperations",
)  # fmt: skip


@pytest.fixture(scope="module")
def session() -> Iterator[SimpleNamespace]:
    clock = ManualClock()
    backend = ComputeBackend(clock=clock)
    backend.wait_s = 0.05
    server = ComputeServer(backend)
    server.app = recorder = Recorder(server.app)
    with server, loopback_only() as blocked:
        opts = ClientOptions(api_endpoint=server.url)
        kw: dict[str, Any] = {"credentials": AnonymousCredentials(), "client_options": opts}
        c = {name: getattr(compute_v1, name + "Client")(**kw) for name in CLIENTS}
        yield SimpleNamespace(url=server.url, backend=backend, clock=clock, c=c, replies=recorder.replies)
    assert blocked == []


def _raw(url: str, method: str = "GET") -> tuple[int, Any]:
    req = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _vm(name: str, model: str, **extra: Any) -> compute_v1.Instance:
    sched = {"provisioning_model": model, "on_host_maintenance": "TERMINATE", **extra.pop("sched", {})}
    machine = f"zones/{ZONE}/machineTypes/ct5p-hightpu-4t"
    return compute_v1.Instance(name=name, machine_type=machine, scheduling=compute_v1.Scheduling(**sched),
                               labels={"tpu-ops-run": "r"}, **extra)  # fmt: skip


def _drive(s: SimpleNamespace) -> None:
    """Create, wait, preempt, list, get and delete what tpu-ops and gcloud use, in every state."""
    c, b, p = s.c, s.backend, PROJECT
    b.configure_capacity({ZONE: {"FLEX_START": 0, "reservations": {"res": {"count": 4, "machineType":
                                                                             "ct5p-hightpu-4t"}}}})  # fmt: skip
    b.set_latency(provision_s=60)
    ins = c["Instances"]
    ins.insert_unary(project=p, zone=ZONE, instance_resource=_vm("spot", "SPOT"))
    ins.insert_unary(project=p, zone=ZONE, instance_resource=_vm(
        "flex", "FLEX_START", sched={"max_run_duration": compute_v1.Duration(seconds=3600)},
        params=compute_v1.InstanceParams(request_valid_for_duration=compute_v1.Duration(seconds=600))))  # fmt: skip
    b.configure_capacity({ZONE: {"STANDARD": 0}})
    ins.insert_unary(project=p, zone=ZONE, instance_resource=_vm("stocked-out", "STANDARD"))
    c["ResourcePolicies"].insert_unary(project=p, region=REGION, resource_policy_resource=compute_v1.ResourcePolicy(
        name="wp", workload_policy=compute_v1.ResourcePolicyWorkloadPolicy(type_="HIGH_THROUGHPUT",
                                                                           accelerator_topology="2x2x4")))  # fmt: skip
    props = compute_v1.InstanceProperties(
        machine_type="ct5p-hightpu-4t", reservation_affinity=compute_v1.ReservationAffinity(**{
            "consume_reservation_type": RES["consumeReservationType"], "key": RES["key"], "values": RES["values"]}),
        scheduling=compute_v1.Scheduling(provisioning_model="RESERVATION_BOUND", on_host_maintenance="TERMINATE"),
    )  # fmt: skip
    c["InstanceTemplates"].insert_unary(project=p, instance_template_resource=compute_v1.InstanceTemplate(
        name="tpl", properties=props))  # fmt: skip
    group = {"instance_template": f"projects/{p}/global/instanceTemplates/tpl", "target_size": 4,
             "target_size_policy": compute_v1.InstanceGroupManagerTargetSizePolicy(mode="BULK"),
             "resource_policies": compute_v1.InstanceGroupManagerResourcePolicies(
                 workload_policy=f"projects/{p}/regions/{REGION}/resourcePolicies/wp")}  # fmt: skip
    c["InstanceGroupManagers"].insert_unary(project=p, zone=ZONE, instance_group_manager_resource=(
        compute_v1.InstanceGroupManager(name="g", **group)))  # fmt: skip
    # The reservation is full: a second BULK group (regional, ANY_SINGLE_ZONE) waits with CREATING instances.
    dist = compute_v1.DistributionPolicy(target_shape="ANY_SINGLE_ZONE", zones=[
        compute_v1.DistributionPolicyZoneConfiguration(zone=f"zones/{ZONE}")])  # fmt: skip
    c["RegionInstanceGroupManagers"].insert_unary(project=p, region=REGION, instance_group_manager_resource=(
        compute_v1.InstanceGroupManager(name="rg", distribution_policy=dist, **group)))  # fmt: skip
    s.clock.advance(60)
    b.tick()
    b.preempt(ZONE, "spot")
    c["InstanceGroupManagers"].get(project=p, zone=ZONE, instance_group_manager="g")
    c["RegionInstanceGroupManagers"].get(project=p, region=REGION, instance_group_manager="rg")
    list(c["InstanceGroupManagers"].list_managed_instances(project=p, zone=ZONE, instance_group_manager="g"))
    list(c["RegionInstanceGroupManagers"].list_managed_instances(project=p, region=REGION, instance_group_manager="rg"))

    for client, kw in [("Instances", {"zone": ZONE}), ("InstanceGroupManagers", {"zone": ZONE}),
                       ("RegionInstanceGroupManagers", {"region": REGION}), ("Reservations", {"zone": ZONE}),
                       ("MachineTypes", {"zone": ZONE}), ("Autoscalers", {"zone": ZONE}),
                       ("RegionAutoscalers", {"region": REGION}), ("InstanceGroups", {"zone": ZONE}),
                       ("RegionInstanceGroups", {"region": REGION}), ("ResourcePolicies", {"region": REGION}),
                       ("InstanceTemplates", {}), ("ZoneOperations", {"zone": ZONE}),
                       ("RegionOperations", {"region": REGION}), ("GlobalOperations", {})]:  # fmt: skip
        list(c[client].list(project=p, **kw))
    for client in ("Instances", "InstanceGroupManagers", "Reservations", "MachineTypes", "ResourcePolicies",
                   "InstanceTemplates", "GlobalOperations"):  # fmt: skip
        list(c[client].aggregated_list(project=p))
    for inst in c["Instances"].list(project=p, zone=ZONE):
        c["Instances"].get(project=p, zone=ZONE, instance=inst.name)
    c["InstanceGroups"].get(project=p, zone=ZONE, instance_group="g")
    c["RegionInstanceGroups"].get(project=p, region=REGION, instance_group="rg")
    c["Reservations"].get(project=p, zone=ZONE, reservation="res")
    c["MachineTypes"].get(project=p, zone=ZONE, machine_type="tpu7x-standard-4t")
    c["Images"].get_from_family(project="ubuntu-os-accelerator-images", family="ubuntu-accel-2204-amd64-tpu-v5p")
    c["Images"].get(project="ubuntu-os-accelerator-images", image="ubuntu-accel-2204-amd64-tpu-v5p-v20261101")
    c["InstanceTemplates"].get(project=p, instance_template="tpl")
    c["ResourcePolicies"].get(project=p, region=REGION, resource_policy="wp")
    c["Zones"].get(project=p, zone=ZONE)
    c["Regions"].get(project=p, region=REGION)
    c["Projects"].get(project=p)
    for op in c["ZoneOperations"].list(project=p, zone=ZONE):
        c["ZoneOperations"].get(project=p, zone=ZONE, operation=op.name)
        _raw(f"{s.url}/compute/v1/projects/{p}/zones/{ZONE}/operations/{op.name}/wait", "POST")
    # What Google answers 404: no autoscaler, an unknown zone / region / image family, anywhere.
    for call in (
        lambda: c["Autoscalers"].get(project=p, zone=ZONE, autoscaler="g"),
        lambda: c["Instances"].insert_unary(project=p, zone="us-east5-z", instance_resource=_vm("x", "SPOT")),
        lambda: list(c["Instances"].list(project=p, zone="us-east5-z")),
        lambda: list(c["RegionInstanceGroupManagers"].list(project=p, region="us-east9")),
        lambda: c["Images"].get_from_family(project="ubuntu-os-accelerator-images", family="windows-2022"),
    ):
        with pytest.raises(gexc.NotFound):
            call()
    c["RegionInstanceGroupManagers"].delete_unary(project=p, region=REGION, instance_group_manager="rg")
    c["InstanceGroupManagers"].delete_unary(project=p, zone=ZONE, instance_group_manager="g")
    ins.delete_unary(project=p, zone=ZONE, instance="flex")


def test_every_answer_fits_the_discovery_document(session):
    _drive(session)
    replies: list[Reply] = list(session.replies)
    assert problems(replies) == []
    # What was checked: each of these discovery methods answered at least once, successfully.
    answered = {(r.method, schema_for(r.method, r.path)) for r in replies if r.status < 400}
    expected = {
        ("GET", s) for s in (
            "Instance", "InstanceList", "InstanceAggregatedList", "InstanceGroupManager", "InstanceGroupManagerList",
            "InstanceGroupManagerAggregatedList", "RegionInstanceGroupManagerList", "Reservation", "ReservationList",
            "ReservationAggregatedList", "MachineType", "MachineTypeList", "MachineTypeAggregatedList", "Image",
            "AutoscalerList", "RegionAutoscalerList", "InstanceGroup", "InstanceGroupList", "RegionInstanceGroupList",
            "ResourcePolicy", "ResourcePolicyList", "InstanceTemplate", "InstanceTemplateList", "Zone", "Region",
            "Project", "Operation", "OperationList", "OperationAggregatedList", "ResourcePolicyAggregatedList",
            "InstanceTemplateAggregatedList",
        )
    } | {("POST", "Operation"), ("DELETE", "Operation"), ("POST", "InstanceGroupManagersListManagedInstancesResponse"),
         ("POST", "RegionInstanceGroupManagersListInstancesResponse")}  # fmt: skip
    assert expected <= answered, expected - answered
    assert sum(r.status == 404 for r in replies) >= 5


def test_the_check_catches_what_google_would_not_send(session):
    """The recorder's check fails on a missing output field, a wrong type, an unknown path, a bad error."""
    base = "/compute/v1/projects/p/zones/z"
    good = {"kind": "compute#zone", "id": "1", "selfLink": "x", "creationTimestamp": "t", "name": "z"}
    assert problems([Reply("GET", base, 200, good)]) == []
    assert problems([Reply("GET", base, 200, {k: v for k, v in good.items() if k != "selfLink"})])
    assert problems([Reply("GET", base, 200, {**good, "status": 3})])
    assert problems([Reply("GET", base + "/instances", 200, {"kind": "compute#instanceList", "id": "i"})])
    assert problems([Reply("GET", base + "/nothing", 200, {})])
    assert problems([Reply("GET", base, 404, {"error": {"message": "gone"}})])
