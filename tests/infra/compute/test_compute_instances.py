"""google-cloud-compute, unchanged, drives the fake's single-host TPU VMs and zone operations."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest
from compute.helpers import PROJECT, REGION, ZONE
from google.api_core import exceptions as gexc
from google.cloud import compute_v1

MT = f"zones/{ZONE}/machineTypes/ct6e-standard-4t"
Op = compute_v1.Operation


def _instance(name: str, model: str = "SPOT", **extra: object) -> compute_v1.Instance:
    sched = {"provisioning_model": model, "on_host_maintenance": "TERMINATE", **extra.pop("scheduling", {})}  # type: ignore[dict-item]
    return compute_v1.Instance(
        name=name,
        machine_type=MT,
        labels={"tpu-ops-run": "run-1"},
        scheduling=compute_v1.Scheduling(**sched),
        metadata=compute_v1.Metadata(items=[compute_v1.Items(key="startup-script", value="true")]),
        **extra,
    )


def _insert(fake, inst: compute_v1.Instance, zone: str = ZONE) -> Op:
    op = fake.instances.insert_unary(project=PROJECT, zone=zone, instance_resource=inst)
    return fake.zone_ops.wait(project=PROJECT, zone=zone, operation=op.name)


def test_spot_instance_lifecycle_preemption_and_delete(fake):
    op = _insert(fake, _instance("w-1"))
    assert op.status == Op.Status.DONE and not op.error.errors
    assert op.operation_type == "insert" and op.target_link.endswith(f"/zones/{ZONE}/instances/w-1")
    assert op.target_link.startswith(fake.url)  # links point at the fake, never at Google

    inst = fake.instances.get(project=PROJECT, zone=ZONE, instance="w-1")
    assert inst.status == "RUNNING" and inst.scheduling.provisioning_model == "SPOT"
    assert inst.labels == {"tpu-ops-run": "run-1"} and inst.machine_type.endswith("/ct6e-standard-4t")
    assert inst.network_interfaces[0].network_i_p.startswith("127.")
    listed = fake.instances.list(
        request=compute_v1.ListInstancesRequest(project=PROJECT, zone=ZONE, filter='labels.tpu-ops-run = "run-1"')
    )
    assert [i.name for i in listed] == ["w-1"]
    none = fake.instances.list(
        request=compute_v1.ListInstancesRequest(project=PROJECT, zone=ZONE, filter="labels.tpu-ops-run = other")
    )
    assert list(none) == []

    fake.backend.preempt(ZONE, "w-1")
    assert fake.instances.get(project=PROJECT, zone=ZONE, instance="w-1").status == "STOPPING"
    flt = 'operationType = "compute.instances.preempted"'
    preempted = list(fake.zone_ops.list(request=compute_v1.ListZoneOperationsRequest(
        project=PROJECT, zone=ZONE, filter=flt)))  # fmt: skip
    assert [o.target_link.rsplit("/", 1)[1] for o in preempted] == ["w-1"]
    fake.clock.advance(29.9)
    fake.backend.tick()
    assert fake.instances.get(project=PROJECT, zone=ZONE, instance="w-1").status == "STOPPING"
    fake.clock.advance(0.2)  # 30 s of fake time after the preemption notice
    fake.backend.tick()
    stopped = fake.instances.get(project=PROJECT, zone=ZONE, instance="w-1")
    assert stopped.status == "TERMINATED" and stopped.status_message == "Instance was preempted."
    op = fake.zone_ops.get(project=PROJECT, zone=ZONE, operation=preempted[0].name)
    assert op.status == Op.Status.DONE

    op = fake.instances.delete_unary(project=PROJECT, zone=ZONE, instance="w-1")
    assert fake.zone_ops.wait(project=PROJECT, zone=ZONE, operation=op.name).status == Op.Status.DONE
    with pytest.raises(gexc.NotFound, match="was not found"):
        fake.instances.get(project=PROJECT, zone=ZONE, instance="w-1")
    assert fake.backend.state()["instances"] == 0


def test_termination_action_delete_removes_the_preempted_instance(fake):
    _insert(fake, _instance("w-2", scheduling={"instance_termination_action": "DELETE"}))
    fake.backend.preempt(ZONE, "w-2")
    fake.clock.advance(30)
    fake.backend.tick()
    with pytest.raises(gexc.NotFound):
        fake.instances.get(project=PROJECT, zone=ZONE, instance="w-2")


def test_stock_out_per_zone_and_provisioning_model(fake):
    fake.backend.configure_capacity({ZONE: {"SPOT": 0}})
    op = _insert(fake, _instance("spot-a"))
    assert op.status == Op.Status.DONE
    assert [e.code for e in op.error.errors] == ["ZONE_RESOURCE_POOL_EXHAUSTED"]
    assert f"zones/{ZONE}" in op.error.errors[0].message
    info = op.error.errors[0].error_details[0].error_info
    assert info.reason == "resource_availability" and info.metadatas["vmType"] == "ct6e-standard-4t"
    with pytest.raises(gexc.NotFound):
        fake.instances.get(project=PROJECT, zone=ZONE, instance="spot-a")
    assert not _insert(fake, _instance("std-a", model="STANDARD")).error.errors  # another model: fine
    assert not _insert(fake, _instance("spot-b"), zone="us-east5-b").error.errors  # another zone: fine


def test_reservation_of_limited_count(fake):
    fake.backend.configure_capacity(
        {ZONE: {"reservations": {"res-1": {"count": 1, "machineType": "ct6e-standard-4t"}}}}
    )
    affinity = compute_v1.ReservationAffinity(
        consume_reservation_type="SPECIFIC_RESERVATION", key="compute.googleapis.com/reservation-name", values=["res-1"]
    )
    assert not _insert(fake, _instance("r-1", "RESERVATION_BOUND", reservation_affinity=affinity)).error.errors
    op = _insert(fake, _instance("r-2", "RESERVATION_BOUND", reservation_affinity=affinity))
    assert [e.code for e in op.error.errors] == ["ZONE_RESOURCE_POOL_EXHAUSTED"]
    res = fake.reservations.get(project=PROJECT, zone=ZONE, reservation="res-1")
    assert (res.specific_reservation.count, res.specific_reservation.in_use_count) == (1, 1)
    assert [r.name for r in fake.reservations.list(project=PROJECT, zone=ZONE)] == ["res-1"]
    with pytest.raises(gexc.NotFound):
        fake.reservations.get(project=PROJECT, zone=ZONE, reservation="nope")


def test_flex_start_waits_pending_for_capacity(fake):
    fake.backend.configure_capacity({ZONE: {"FLEX_START": 0}})
    inst = _instance("f-1", "FLEX_START", scheduling={"max_run_duration": compute_v1.Duration(seconds=3600),
                                                      "instance_termination_action": "DELETE"})  # fmt: skip
    inst.params = compute_v1.InstanceParams(request_valid_for_duration=compute_v1.Duration(seconds=600))
    op = fake.instances.insert_unary(project=PROJECT, zone=ZONE, instance_resource=inst)
    assert fake.instances.get(project=PROJECT, zone=ZONE, instance="f-1").status == "PENDING"
    assert fake.zone_ops.get(project=PROJECT, zone=ZONE, operation=op.name).status != Op.Status.DONE
    fake.backend.configure_capacity({ZONE: {"FLEX_START": 4}})
    assert fake.zone_ops.get(project=PROJECT, zone=ZONE, operation=op.name).status == Op.Status.DONE
    assert fake.instances.get(project=PROJECT, zone=ZONE, instance="f-1").status == "RUNNING"
    fake.clock.advance(3600)  # maxRunDuration, then instanceTerminationAction DELETE
    fake.backend.tick()
    with pytest.raises(gexc.NotFound):
        fake.instances.get(project=PROJECT, zone=ZONE, instance="f-1")


def test_regional_tpu_quota(fake):
    fake.backend.set_quotas({REGION: {"PREEMPTIBLE_TPU_PODSLICE_V6E": 4}})
    assert not _insert(fake, _instance("q-1")).error.errors
    op = _insert(fake, _instance("q-2"))
    assert [e.code for e in op.error.errors] == ["QUOTA_EXCEEDED"]
    quotas = {q.metric: (q.limit, q.usage) for q in fake.regions.get(project=PROJECT, region=REGION).quotas}
    assert quotas["PREEMPTIBLE_TPU_PODSLICE_V6E"] == (4.0, 4.0)
    assert quotas["TPU_PODSLICE_V5P"] == (4096.0, 0.0)
    assert fake.zones.get(project=PROJECT, zone=ZONE).region.endswith(f"/regions/{REGION}")
    assert fake.projects.get(project=PROJECT).name == PROJECT  # the API answers for the project


def test_bad_input_is_refused_naming_the_field(fake):
    with pytest.raises(gexc.BadRequest, match=r"provisioningModel.*allowed: STANDARD, SPOT, FLEX_START"):
        _insert(fake, _instance("bad", model="CHEAP"))
    with pytest.raises(gexc.BadRequest, match="machineType"):
        _insert(fake, compute_v1.Instance(name="bad", machine_type=f"zones/{ZONE}/machineTypes/n2-standard-4"))
    _insert(fake, _instance("dup"))
    with pytest.raises(gexc.Conflict, match="already exists"):
        _insert(fake, _instance("dup"))


def test_injected_faults_answer_with_their_status(fake):
    fake.backend.add_fault(r"/instances$", 503, count=1, method="POST")
    with pytest.raises(gexc.ServiceUnavailable):
        _insert(fake, _instance("x-1"))
    assert not _insert(fake, _instance("x-1")).error.errors  # the next call goes through


def test_operation_result_would_poll_google_and_the_guard_catches_it(fake):
    """The pitfall: ``insert(...).result()`` polls compute.googleapis.com whatever the endpoint."""
    ext = fake.instances.insert(project=PROJECT, zone=ZONE, instance_resource=_instance("pit"))
    fake.clock.advance(0)
    with pytest.raises(Exception):
        ext.result(timeout=5)
    assert any("googleapis.com" in b for b in fake.blocked)
    fake.blocked.clear()  # seen and expected here; every other test must leave it empty


def test_list_filters_and_the_aggregated_list_across_zones(fake):
    _insert(fake, _instance("a-1"))
    _insert(fake, _instance("a-2", model="STANDARD"))
    _insert(fake, _instance("b-1"), zone="us-east5-b")

    def names(flt: str, zone: str = ZONE) -> list[str]:
        req = compute_v1.ListInstancesRequest(project=PROJECT, zone=zone, filter=flt)
        return [i.name for i in fake.instances.list(request=req)]

    assert names('(labels.tpu-ops-run = "run-1") (scheduling.provisioningModel = SPOT)') == ["a-1"]
    assert names("name eq a-.*") == ["a-1", "a-2"] and names("name ne a-.*") == []
    assert names("labels.tpu-ops-run:*") == ["a-1", "a-2"] and names("labels.owner:*") == []
    assert names('name = "a-*" AND status != RUNNING') == []
    with pytest.raises(gexc.BadRequest, match="filter"):
        names("name = a-1 OR name = a-2")
    agg = fake.instances.aggregated_list(
        request=compute_v1.AggregatedListInstancesRequest(project=PROJECT, filter='labels.tpu-ops-run = "run-1"')
    )
    found = {scope: sorted(i.name for i in scoped.instances) for scope, scoped in agg}
    assert found == {f"zones/{ZONE}": ["a-1", "a-2"], "zones/us-east5-b": ["b-1"]}


def _post(url: str, body: object) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"content-type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


def test_control_endpoints_over_http(fake):
    """What a dry run in another process uses: capacity, latency, preempt, faults, state, reset."""
    caps = _post(f"{fake.url}/_fake/capacity", {ZONE: {"SPOT": 0}, "*": {"STANDARD": 8}})
    assert caps["zones"][ZONE]["SPOT"] == 0 and caps["zones"]["*"]["STANDARD"] == 8
    assert [e.code for e in _insert(fake, _instance("h-1")).error.errors] == ["ZONE_RESOURCE_POOL_EXHAUSTED"]
    _post(f"{fake.url}/_fake/capacity", {ZONE: {"SPOT": 64}})
    assert not _insert(fake, _instance("h-1")).error.errors
    assert _post(f"{fake.url}/_fake/latency", {"preempt_notice_s": 5})["preempt_notice_s"] == 5
    assert _post(f"{fake.url}/_fake/zones/{ZONE}/instances/h-1:preempt", {})["status"] == "STOPPING"
    fake.clock.advance(5)
    _post(f"{fake.url}/_fake/tick", {})
    assert fake.instances.get(project=PROJECT, zone=ZONE, instance="h-1").status == "TERMINATED"
    assert _post(f"{fake.url}/_fake/faults", {"path": "/instances/h-1$", "status": 429})["faults_pending"] == 1
    with pytest.raises(gexc.TooManyRequests):
        fake.instances.get(project=PROJECT, zone=ZONE, instance="h-1")
    with urllib.request.urlopen(f"{fake.url}/_fake/state", timeout=10) as resp:
        state = json.loads(resp.read())
    assert state["instance_states"] == {f"projects/{PROJECT}/zones/{ZONE}/instances/h-1": "TERMINATED"}
    _post(f"{fake.url}/_fake/reset", {})
    assert fake.backend.state()["instances"] == 0 and fake.backend.capacity.zone(ZONE).chips["SPOT"] == 4096
    with pytest.raises(urllib.error.HTTPError) as err:
        _post(f"{fake.url}/_fake/capacity", {ZONE: {"spot": 1}})
    assert err.value.code == 400 and "unknown key 'spot'" in json.loads(err.value.read())["error"]["message"]


def test_a_retried_insert_with_the_same_request_id_returns_the_first_operation(fake):
    def insert(request_id: str) -> Op:
        req = compute_v1.InsertInstanceRequest(
            project=PROJECT, zone=ZONE, instance_resource=_instance("rq"), request_id=request_id
        )
        return fake.instances.insert_unary(request=req)

    first = insert("6f1d0c1e-0000-4000-8000-000000000001")
    assert insert("6f1d0c1e-0000-4000-8000-000000000001").name == first.name  # not 409: the same request, once
    with pytest.raises(gexc.Conflict):
        insert("6f1d0c1e-0000-4000-8000-000000000002")
    assert fake.backend.state()["instances"] == 1


def test_deleting_during_the_preemption_notice_ends_the_preemption(fake):
    _insert(fake, _instance("n-1"))
    fake.backend.preempt(ZONE, "n-1")
    op = fake.instances.delete_unary(project=PROJECT, zone=ZONE, instance="n-1")
    assert fake.zone_ops.wait(project=PROJECT, zone=ZONE, operation=op.name).status == Op.Status.DONE
    with pytest.raises(gexc.NotFound):
        fake.instances.get(project=PROJECT, zone=ZONE, instance="n-1")
    ops = fake.zone_ops.list(request=compute_v1.ListZoneOperationsRequest(
        project=PROJECT, zone=ZONE, filter='operationType = "compute.instances.preempted"'))  # fmt: skip
    assert [o.status for o in ops] == [Op.Status.DONE]
