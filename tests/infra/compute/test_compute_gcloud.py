"""The real ``gcloud`` runs Google's documented TPU-on-Compute-Engine commands against the fake and gets
the answers Google gives: one test per page section (the page named in each docstring).

gcloud 528's GA track has no ``--target-size-policy-mode`` (bulk mode): the pages that use it go
through ``gcloud alpha``, which sends to the same overridden endpoint. One fake for the module
(``gcloud_fake``), reset before each test; every reply it gave is checked against the discovery
document last.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
from compute.gcloud_harness import GCLOUD_SKIP, Gcloud
from compute.recorder import problems

pytestmark = GCLOUD_SKIP
ZONE, REGION = "us-east5-a", "us-east5"
IMAGE = ("--image-family=ubuntu-accel-2204-amd64-tpu-v5p", "--image-project=ubuntu-os-accelerator-images")


@pytest.fixture
def fake(gcloud_fake: SimpleNamespace) -> Iterator[SimpleNamespace]:
    gcloud_fake.backend.reset()
    yield gcloud_fake


def _leaf(link: str) -> str:
    return link.rsplit("/", 1)[-1]


def _slice_parts(g: Gcloud, model: str, *template_flags: str) -> None:
    """Steps 1-2 of the multi-host pages: the workload policy (a 2x2x4 v5p slice: 4 hosts), the template."""
    g.run("compute", "resource-policies", "create", "workload-policy", "wp", "--type=HIGH_THROUGHPUT",
          "--accelerator-topology=2x2x4", f"--region={REGION}")  # fmt: skip
    g.run("compute", "instance-templates", "create", "tpl", "--machine-type=ct5p-hightpu-4t",
          "--maintenance-policy=TERMINATE", f"--provisioning-model={model}", *template_flags, *IMAGE)  # fmt: skip


def test_single_host_tpu_vm_create_describe_list_delete(fake):
    """Page "Create a TPU VM instance" (compute/docs/tpus/create-tpu-vm-instance): a single-host v6e slice
    on demand, then described, listed and deleted."""
    g = fake.gcloud
    g.run("compute", "instances", "create", "tpu-vm", f"--zone={ZONE}", "--machine-type=ct6e-standard-4t",
          "--provisioning-model=STANDARD", "--maintenance-policy=TERMINATE",
          "--image-family=ubuntu-accel-2204-amd64-tpu-v6e", "--image-project=ubuntu-os-accelerator-images")  # fmt: skip
    vm = g.json("compute", "instances", "describe", "tpu-vm", f"--zone={ZONE}")
    assert (vm["status"], _leaf(vm["machineType"]), vm["scheduling"]["provisioningModel"]) == (
        "RUNNING", "ct6e-standard-4t", "STANDARD")  # fmt: skip
    assert vm["disks"][0]["initializeParams"]["sourceImage"].endswith("ubuntu-accel-2204-amd64-tpu-v6e")
    assert [i["name"] for i in g.json("compute", "instances", "list")] == ["tpu-vm"]
    g.run("compute", "instances", "delete", "tpu-vm", f"--zone={ZONE}")
    assert fake.backend.state()["instances"] == 0


def test_single_host_spot_tpu_vm(fake):
    """Page "Request TPU Spot VMs" (tpu/docs/spot-compute), "Using individual instances": a v5p Spot VM with
    its termination action; it is created SPOT and deleted when preempted."""
    g = fake.gcloud
    g.run("compute", "instances", "create", "spot-vm", f"--zone={ZONE}", "--machine-type=ct5p-hightpu-4t",
          "--provisioning-model=SPOT", "--instance-termination-action=DELETE", "--maintenance-policy=TERMINATE",
          *IMAGE)  # fmt: skip
    sched = g.json("compute", "instances", "describe", "spot-vm", f"--zone={ZONE}")["scheduling"]
    assert (sched["provisioningModel"], sched["instanceTerminationAction"]) == ("SPOT", "DELETE")
    fake.backend.set_latency(preempt_notice_s=0)  # (reset before the next test)
    fake.backend.preempt(ZONE, "spot-vm")
    fake.backend.tick()
    assert fake.backend.state()["instances"] == 0  # DELETE on preemption: gone


def test_multi_host_spot_slice_as_a_mig(fake):
    """Page "Request TPU Spot VMs" (tpu/docs/spot-compute), "Using MIGs for multi-host slices": a SPOT template
    (maintenance policy TERMINATE, termination action STOP) and a MIG over it with the workload policy;
    described, its instances listed, deleted, and its parts after it."""
    g = fake.gcloud
    _slice_parts(g, "SPOT", "--instance-termination-action=STOP")
    g.run("compute", "instance-groups", "managed", "create", "spot-slice", "--size=4", "--template=tpl",
          f"--zone={ZONE}", "--workload-policy=wp")  # fmt: skip
    mig = g.json("compute", "instance-groups", "managed", "describe", "spot-slice", f"--zone={ZONE}")
    assert (mig["targetSize"], _leaf(mig["instanceTemplate"]), _leaf(mig["resourcePolicies"]["workloadPolicy"])) == (
        4, "tpl", "wp")  # fmt: skip
    assert mig["status"]["isStable"] and mig["status"]["appliedAcceleratorTopologies"][0]["state"] == "ACTIVE"
    members = g.json("compute", "instance-groups", "managed", "list-instances", "spot-slice", f"--zone={ZONE}")
    assert [(m["instanceStatus"], _leaf(m["version"]["instanceTemplate"])) for m in members] == [("RUNNING", "tpl")] * 4
    assert {s.split("/")[-1] for s in fake.backend.state()["instance_states"]} == {m["name"] for m in members}
    g.run("compute", "instance-groups", "managed", "delete", "spot-slice", f"--zone={ZONE}")
    g.run("compute", "instance-templates", "delete", "tpl")
    g.run("compute", "resource-policies", "delete", "wp", f"--region={REGION}")
    state = fake.backend.state()
    assert (state["instances"], state["instance_group_managers"], state["instance_templates"]) == (0, 0, 0)
    assert state["resource_policies"] == 0


def test_multi_host_slice_mig_with_workload_policy(fake):
    """Page "Create a MIG with multi-host TPU slice" (compute/docs/tpus/create-tpu-mig-multi-host-slice): workload
    policy, a reservation-bound template, the MIG all at once (bulk mode, DO_NOTHING on failure), then
    describe, list-instances, list and delete."""
    g = fake.gcloud
    fake.backend.configure_capacity({ZONE: {"reservations": {"res": {"count": 4, "machineType": "ct5p-hightpu-4t"}}}})
    _slice_parts(g, "RESERVATION_BOUND", "--instance-termination-action=DELETE", "--reservation-affinity=specific",
                 "--reservation=res")  # fmt: skip
    g.run("alpha", "compute", "instance-groups", "managed", "create", "slice", "--size=4", "--template=tpl",
          f"--zone={ZONE}", "--workload-policy=wp", "--target-size-policy-mode=bulk",
          "--default-action-on-vm-failure=do-nothing")  # fmt: skip
    mig = g.json("compute", "instance-groups", "managed", "describe", "slice", f"--zone={ZONE}")
    assert mig["targetSizePolicy"]["mode"] == "BULK" and mig["status"]["bulkInstanceOperation"]["inProgress"] is False
    members = g.json("compute", "instance-groups", "managed", "list-instances", "slice", f"--zone={ZONE}")
    assert sorted(m["instanceStatus"] for m in members) == ["RUNNING"] * 4
    listed = g.json("compute", "instance-groups", "managed", "list")
    assert [(m["name"], _leaf(m["zone"])) for m in listed] == [("slice", ZONE)]
    reservation = g.json("compute", "reservations", "describe", "res", f"--zone={ZONE}")
    assert reservation["specificReservation"]["inUseCount"] == "4"
    g.run("compute", "instance-groups", "managed", "delete", "slice", f"--zone={ZONE}")
    assert fake.backend.state()["instance_group_managers"] == 0 and fake.backend.state()["instances"] == 0


def test_bulk_mig_waits_with_creating_instances_then_regional_any_single_zone(fake):
    """Page "Create a MIG that uses the bulk mode" (compute/docs/instance-groups/bulk-create-instances-in-mig):
    while capacity is short the group's instances are listed CREATING with the stock-out as their last
    error, and no VM exists; a regional bulk MIG takes only the ANY_SINGLE_ZONE shape."""
    g, b = fake.gcloud, fake.backend
    b.configure_capacity({ZONE: {"reservations": {"res": {"count": 4, "machineType": "ct5p-hightpu-4t"}}}})
    _slice_parts(g, "RESERVATION_BOUND", "--reservation-affinity=specific", "--reservation=res")
    b.configure_capacity({ZONE: {"reservations": {"res": {"count": 3, "machineType": "ct5p-hightpu-4t"}}}})
    g.run("alpha", "compute", "instance-groups", "managed", "create", "bulk", "--size=4", "--template=tpl",
          f"--zone={ZONE}", "--workload-policy=wp", "--target-size-policy-mode=bulk")  # fmt: skip
    out = g.run("compute", "instance-groups", "managed", "list-instances", "bulk", f"--zone={ZONE}").stdout
    rows = out.splitlines()[1:]
    assert len(rows) == 4 and all(" CREATING " in r and "ZONE_RESOURCE_POOL_EXHAUSTED" in r for r in rows), out
    assert b.state()["instances"] == 0
    b.configure_capacity({ZONE: {"reservations": {"res": {"count": 4, "machineType": "ct5p-hightpu-4t"}}}})
    members = g.json("compute", "instance-groups", "managed", "list-instances", "bulk", f"--zone={ZONE}")
    assert sorted(m["instanceStatus"] for m in members) == ["RUNNING"] * 4
    assert sorted(m["name"] for m in members) == sorted(r.split()[0] for r in rows)  # the names it listed

    regional = ("alpha", "compute", "instance-groups", "managed", "create", "rbulk", "--size=4",
                "--template=tpl", f"--region={REGION}", "--target-size-policy-mode=bulk",
                "--instance-redistribution-type=none")  # fmt: skip
    assert "ANY_SINGLE_ZONE" in g.fails(*regional)  # the default shape, EVEN, is refused
    g.run(*regional, "--target-distribution-shape=any-single-zone", f"--zones={ZONE},us-east5-b")
    rmig = g.json("compute", "instance-groups", "managed", "describe", "rbulk", f"--region={REGION}")
    assert rmig["distributionPolicy"]["targetShape"] == "ANY_SINGLE_ZONE" and _leaf(rmig["region"]) == REGION
    waiting = g.json("compute", "instance-groups", "managed", "list-instances", "rbulk", f"--region={REGION}")
    assert [m["currentAction"] for m in waiting] == ["CREATING"] * 4  # the reservation is the zonal group's
    g.run("compute", "instance-groups", "managed", "delete", "rbulk", f"--region={REGION}")
    g.run("compute", "instance-groups", "managed", "delete", "bulk", f"--zone={ZONE}")
    assert b.state()["instance_group_managers"] == 0


def test_reservations_describe_and_list(fake):
    """Page "View reservations" (compute/docs/instances/reservations-view): list across zones, describe one."""
    g = fake.gcloud
    fake.backend.configure_capacity({
        ZONE: {"reservations": {"v5p-res": {"count": 16, "machineType": "ct5p-hightpu-4t"}}},
        "us-central1-a": {"reservations": {"v6e-res": {"count": 2, "machineType": "ct6e-standard-4t"}}},
    })  # fmt: skip
    listed = g.json("compute", "reservations", "list")
    assert sorted((r["name"], _leaf(r["zone"])) for r in listed) == [("v5p-res", ZONE), ("v6e-res", "us-central1-a")]
    res = g.json("compute", "reservations", "describe", "v5p-res", f"--zone={ZONE}")
    assert (res["specificReservation"]["count"], res["specificReservationRequired"], res["status"]) == (
        "16", True, "READY")  # fmt: skip
    assert "was not found" in g.fails("compute", "reservations", "describe", "nope", f"--zone={ZONE}")


def test_calendar_requests_created_reviewed_described_and_listed(fake):
    """Pages "Create a future reservation request in calendar mode" (compute/docs/instances/
    create-future-reservations-calendar-mode) and "View reservations or future reservation requests":
    gcloud 528 has ``future-reservations`` in its beta track only. Two v5p requests for the same days
    where the zone has calendar capacity for one: Google's review approves the first, declines the second
    (``status.procurementStatus: DECLINED``, no reason field); neither is cancelled nor past its end
    time, so neither can be deleted ("Delete a future reservation request in calendar mode")."""
    g, b = fake.gcloud, fake.backend
    b.configure_capacity({ZONE: {"CALENDAR": {"v5p": 16}}})
    start = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 3600))
    end = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 3600 + 2 * 86400))
    for name in ("first", "second"):
        g.run("beta", "compute", "future-reservations", "create", name, f"--zone={ZONE}",
              "--reservation-mode=CALENDAR", f"--reservation-name={name}-res", "--tpu-version=V5P",
              "--chip-count=16", "--workload-type=BATCH", f"--start-time={start}", f"--end-time={end}",
              "--auto-delete-auto-created-reservations")  # fmt: skip
    got = {n: g.json("beta", "compute", "future-reservations", "describe", n, f"--zone={ZONE}")
           for n in ("first", "second")}  # fmt: skip
    assert {n: f["status"] for n, f in got.items()} == {
        "first": {"procurementStatus": "APPROVED"}, "second": {"procurementStatus": "DECLINED"}}  # fmt: skip
    assert got["second"]["aggregateReservation"]["vmFamily"] == "VM_FAMILY_CLOUD_TPU_POD_SLICE_CT5P"
    listed = g.json("beta", "compute", "future-reservations", "list")
    assert sorted((f["name"], f["status"]["procurementStatus"]) for f in listed) == [
        ("first", "APPROVED"), ("second", "DECLINED")]  # fmt: skip
    err = g.fails("beta", "compute", "future-reservations", "delete", "second", f"--zone={ZONE}")
    assert "DECLINED: it can be deleted only after it is cancelled or after its end time" in err


def test_calendar_request_cancelled_then_deleted(fake):
    """Page "Delete a future reservation request in calendar mode" (compute/docs/instances/
    delete-future-reservations-calendar-mode): an approved request cannot be deleted as it is; cancelled
    (``gcloud beta compute future-reservations cancel``) it is kept as CANCELLED, then deleted."""
    g = fake.gcloud
    start = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 3600))
    end = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 3600 + 86400))
    g.run("beta", "compute", "future-reservations", "create", "cal", f"--zone={ZONE}", "--reservation-mode=CALENDAR",
          "--tpu-version=V5P", "--chip-count=16", "--workload-type=BATCH", f"--start-time={start}",
          f"--end-time={end}", "--auto-delete-auto-created-reservations")  # fmt: skip
    err = g.fails("beta", "compute", "future-reservations", "delete", "cal", f"--zone={ZONE}")
    assert "APPROVED: it can be deleted only after it is cancelled or after its end time" in err
    g.run("beta", "compute", "future-reservations", "cancel", "cal", f"--zone={ZONE}")
    got = g.json("beta", "compute", "future-reservations", "describe", "cal", f"--zone={ZONE}")
    assert got["status"] == {"procurementStatus": "CANCELLED"}
    g.run("beta", "compute", "future-reservations", "delete", "cal", f"--zone={ZONE}")
    assert g.json("beta", "compute", "future-reservations", "list") == []


def test_operations_list_finds_a_preemption_and_describes_it(fake):
    """Page "Spot VMs" (compute/docs/instances/spot), "Detect preemption": ``operations list`` with the
    ``compute.instances.preempted`` filter (an aggregated list over every zone), then ``describe``."""
    g, b = fake.gcloud, fake.backend
    g.run("compute", "instances", "create", "spot-1", "--zone=us-east5-b", "--machine-type=ct6e-standard-4t",
          "--provisioning-model=SPOT", "--maintenance-policy=TERMINATE", *IMAGE)  # fmt: skip
    b.preempt("us-east5-b", "spot-1")
    ops = g.json("compute", "operations", "list", "--filter=operationType=compute.instances.preempted")
    assert [(_leaf(o["targetLink"]), _leaf(o["zone"])) for o in ops] == [("spot-1", "us-east5-b")]
    op = g.json("compute", "operations", "describe", ops[0]["name"], "--zone=us-east5-b")
    assert (op["operationType"], op["statusMessage"]) == ("compute.instances.preempted", "Instance was preempted.")
    every = g.json("compute", "operations", "list")
    assert {o["operationType"] for o in every} == {"insert", "compute.instances.preempted"}


def test_machine_types_list_and_describe(fake):
    """Page "TPU machine types" (compute/docs/tpus/tpu-machines): the TPU machine types a zone offers."""
    g = fake.gcloud
    names = [m["name"] for m in g.json("compute", "machine-types", "list", f"--zones={ZONE}")]
    assert {"ct5p-hightpu-4t", "ct6e-standard-4t", "tpu7x-standard-4t"} <= set(names)
    every = g.json("compute", "machine-types", "list", "--filter=name=tpu7x-standard-4t")
    assert len(every) > 10 and {m["name"] for m in every} == {"tpu7x-standard-4t"}  # aggregated, every zone
    mt = g.json("compute", "machine-types", "describe", "ct5p-hightpu-4t", f"--zone={ZONE}")
    assert (mt["guestCpus"], mt["memoryMb"], mt["zone"]) == (208, 448 * 1024, ZONE)


def test_a_zone_that_does_not_exist_is_not_found(fake):
    """Page "Regions and zones" (compute/docs/regions-zones): a zone Google does not have answers 404."""
    g = fake.gcloud
    err = g.fails("compute", "instances", "create", "vm", "--zone=us-east5-z", "--machine-type=ct6e-standard-4t",
                  "--maintenance-policy=TERMINATE")  # fmt: skip
    assert "projects/proj/zones/us-east5-z' was not found" in err
    assert fake.backend.state()["instances"] == 0


def test_every_answer_gcloud_got_fits_the_discovery_document(gcloud_fake):
    """Last: every reply the fake gave gcloud in this module, against the compute.v1 discovery document."""
    if not gcloud_fake.replies:
        pytest.skip("no gcloud command ran before this test: run the whole module")
    assert problems(gcloud_fake.replies) == []
