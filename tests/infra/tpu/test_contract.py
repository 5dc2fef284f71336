"""One lifecycle suite, two implementations: the in-process model and HTTP via google-cloud-tpu."""

from __future__ import annotations

import pytest
from adapters import PROJECT, ApiError, InProcess, OverHttp

from infra.local.tpu.clock import ManualClock
from infra.local.tpu.models import TpuBackend
from infra.local.tpu.server import TpuServer

ZONE = "us-central2-b"


@pytest.fixture(params=["inprocess", "http"])
def api(request):
    clock = ManualClock()
    backend = TpuBackend(clock=clock)
    if request.param == "inprocess":
        yield InProcess(backend, clock)
        return
    with TpuServer(backend) as server:
        yield OverHttp(backend, clock, server.url)


def test_spot_queued_resource_becomes_active_with_ready_node(api):
    name = api.create_qr(ZONE, "qr-a", "node-a", tier="spot", labels={"run": "r1"})
    assert name == f"projects/{PROJECT}/locations/{ZONE}/queuedResources/qr-a"
    assert api.qr_state(ZONE, "qr-a") == "ACTIVE"
    node = api.node(ZONE, "node-a")
    assert node["state"] == "READY"
    assert node["labels"] == {"run": "r1"}
    assert node["queued_resource"] == name


def test_create_is_idempotent_per_request_id_and_conflicts_otherwise(api):
    api.create_qr(ZONE, "qr-a", "node-a")
    assert api.create_qr(ZONE, "qr-a", "node-a").endswith("/qr-a")  # same requestId -> same operation
    with pytest.raises(ApiError) as e:
        api.create_qr(ZONE, "qr-b", "node-a")  # node id taken
    assert e.value.status == "ALREADY_EXISTS"


def test_list_and_page(api):
    for i in range(5):
        api.create_node(ZONE, f"n{i}")
    pages = api.list_node_pages(ZONE, page_size=2)
    assert pages == [["n0", "n1"], ["n2", "n3"], ["n4"]]


def test_preempt_then_force_delete(api):
    api.create_qr(ZONE, "qr-a", "node-a", tier="spot")
    api.preempt(ZONE, "node-a")
    assert api.node(ZONE, "node-a")["state"] == "PREEMPTED"
    assert api.qr_state(ZONE, "qr-a") == "SUSPENDED"
    assert api.state()["chips_in_use"][ZONE]["spot"] == 4  # preempted still holds its chips
    with pytest.raises(ApiError) as e:
        api.delete_qr(ZONE, "qr-a")  # without force: it still has a node
    assert e.value.status == "FAILED_PRECONDITION"
    api.delete_qr(ZONE, "qr-a", force=True)
    state = api.state()
    assert (state["nodes"], state["queued_resources"]) == (0, 0)


def test_reservation_full_request_waits_then_fails(api):
    api.capacity({ZONE: {"reservations": {"res-a": 4}}})
    api.create_qr(ZONE, "qr-1", "node-1", accel="v4-8", tier="reservation:res-a")
    assert api.qr_state(ZONE, "qr-1") == "ACTIVE"
    api.create_qr(ZONE, "qr-2", "node-2", accel="v4-8", tier="reservation:res-a", valid_for="600s")
    assert api.qr_state(ZONE, "qr-2") == "WAITING_FOR_RESOURCES"
    api.advance(601)
    assert api.qr_state(ZONE, "qr-2") == "FAILED"


def test_waiting_request_gets_capacity_when_freed(api):
    api.capacity({ZONE: {"reservations": {"res-a": 4}}})
    api.create_qr(ZONE, "qr-1", "node-1", tier="reservation:res-a")
    api.create_qr(ZONE, "qr-2", "node-2", tier="reservation:-")  # any reservation in the zone
    assert api.qr_state(ZONE, "qr-2") == "WAITING_FOR_RESOURCES"
    api.delete_qr(ZONE, "qr-1", force=True)
    api.advance(1)
    assert api.qr_state(ZONE, "qr-2") == "ACTIVE"


def test_unknown_reservation_is_rejected(api):
    with pytest.raises(ApiError) as e:
        api.create_qr(ZONE, "qr-1", "node-1", tier="reservation:nope")
    assert e.value.status == "NOT_FOUND"


def test_direct_create_beyond_capacity_fails_at_once(api):
    api.capacity({ZONE: {"on-demand": 8}})
    assert api.create_node(ZONE, "n1", accel="v4-16") == "READY"
    with pytest.raises(ApiError) as e:
        api.create_node(ZONE, "n2", accel="v4-8")
    assert e.value.status == "RESOURCE_EXHAUSTED"


def test_503_three_times_then_success(api):
    api.fault(r"/queuedResources$", 503, 3)
    with pytest.raises(ApiError) as e:
        api.create_qr(ZONE, "qr-x", "node-x")
    assert e.value.status == "UNAVAILABLE"
    # two faults left: a retrying caller sees them and then succeeds
    assert api.create_qr(ZONE, "qr-a", "node-a", retry=True).endswith("/qr-a")
    assert api.state()["faults_pending"] == 0
    assert api.backend.faults_served() == 3


def test_multi_host_slice_has_one_endpoint_per_host(api):
    api.create_qr(ZONE, "qr-a", "node-a", accel="v4-32")
    assert api.node(ZONE, "node-a")["endpoints"] == 4
    api.create_qr(ZONE, "qr-b", "node-b", accel="v5p-128")
    assert api.node(ZONE, "node-b")["endpoints"] == 16


def test_deleting_the_node_suspends_its_queued_resource(api):
    api.create_qr(ZONE, "qr-a", "node-a")
    api.delete_node(ZONE, "node-a")
    assert api.qr_state(ZONE, "qr-a") == "SUSPENDED"
    api.delete_qr(ZONE, "qr-a")  # no node left: no force needed
    assert api.state()["queued_resources"] == 0


def test_get_missing_is_not_found(api):
    with pytest.raises(ApiError) as e:
        api.node(ZONE, "nope")
    assert e.value.status == "NOT_FOUND"
