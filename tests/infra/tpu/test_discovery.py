"""Every response shape of the fake, over HTTP, in both enum encodings, fits the tpu.v2 discovery doc."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest
from discovery import validate

from infra.local.tpu.clock import ManualClock
from infra.local.tpu.models import TpuBackend
from infra.local.tpu.server import TpuServer

ZONE = "us-central2-b"
P = f"projects/proj/locations/{ZONE}"
NODE = {"acceleratorType": "v4-32", "runtimeVersion": "tpu-ubuntu2204-base", "labels": {"run": "r"},
        "metadata": {"startup-script": "true"}, "schedulingConfig": {"spot": True}}  # fmt: skip


def _qr(node_id: str, **tier: object) -> dict:
    return {"tpu": {"nodeSpec": [{"parent": P, "nodeId": node_id, "node": NODE}]}, **tier}


@pytest.fixture(scope="module")
def url():
    clock = ManualClock()
    backend = TpuBackend(clock=clock)
    with TpuServer(backend) as server:
        backend.configure_capacity({ZONE: {"reservations": {"r1": 16}}})
        backend.create_node(P, "direct", NODE)
        backend.create_queued_resource(P, "active", _qr("n-active", spot={}))
        multi = {"parent": P, "multisliceParams": {"nodeCount": 2, "nodeIdPrefix": "ms"}, "node": NODE}
        backend.create_queued_resource(P, "multi", {"tpu": {"nodeSpec": [multi]}, "spot": {}})
        backend.create_queued_resource(P, "suspended", _qr("n-susp", spot={}))
        backend.preempt(ZONE, "n-susp")
        backend.create_queued_resource(P, "res", _qr("n-res", reservationName=f"{P}/reservations/r1"))
        backend.create_queued_resource(
            P,
            "failed",
            _qr("n-fail", reservationName=f"{P}/reservations/-", queueingPolicy={"validUntilDuration": "5s"}),
        )
        clock.advance(6)
        backend.create_queued_resource(P, "waiting", _qr("n-wait", reservationName=f"{P}/reservations/r1"))
        backend.set_latency(provision_s=60)
        backend.create_node(P, "creating", NODE)  # its operation stays not done
        backend.delete_node(f"{P}/nodes/direct")
        backend.set_guest_attribute(f"{P}/nodes/n-active", 0, "ns", "k", "v")
        yield server.url


def _get(url: str, method: str = "GET", body: dict | None = None) -> tuple[int, dict]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.mark.parametrize("alt", ["", "$alt=json;enum-encoding=int", "alt=json"])
def test_every_response_fits_the_discovery_document(url, alt):
    q = f"?{alt}" if alt else ""
    cases = [
        ("ListNodesResponse", f"/v2/{P}/nodes"),
        ("Node", f"/v2/{P}/nodes/n-active"),
        ("Node", f"/v2/{P}/nodes/n-susp"),
        ("ListQueuedResourcesResponse", f"/v2/{P}/queuedResources"),
        ("QueuedResource", f"/v2/{P}/queuedResources/failed"),
        ("QueuedResource", f"/v2/{P}/queuedResources/multi"),  # multisliceParams
        ("Node", f"/v2/{P}/nodes/ms-1"),  # multisliceNode
        ("ListOperationsResponse", f"/v2/{P}/operations"),
        ("ListAcceleratorTypesResponse", f"/v2/{P}/acceleratorTypes"),
        ("AcceleratorType", f"/v2/{P}/acceleratorTypes/v4-32"),
        ("ListRuntimeVersionsResponse", f"/v2/{P}/runtimeVersions"),
        ("RuntimeVersion", f"/v2/{P}/runtimeVersions/tpu-ubuntu2204-base"),
    ]
    seen_states = set()
    for schema, path in cases:
        status, body = _get(url + path + q)
        assert status == 200, (path, body)
        assert validate(schema, body) == [], path
        for qr in body.get("queuedResources", []):
            seen_states.add(str(qr["state"]["state"]))
    assert len(seen_states) == 4  # ACTIVE, SUSPENDED, FAILED, WAITING_FOR_RESOURCES (names or ints)
    ops = _get(url + f"/v2/{P}/operations" + q)[1]["operations"]
    assert {"error" in o for o in ops} == {False} and {o["done"] for o in ops} == {True, False}
    for op in ops:
        assert set(op) <= {"name", "metadata", "done", "error", "response"}
        assert validate("Operation", _get(url + f"/v2/{op['name']}" + q)[1]) == []
    status, body = _get(url + f"/v2/{P}/nodes/n-active:getGuestAttributes" + q, "POST", {"queryPath": "ns/"})
    assert status == 200 and validate("GetGuestAttributesResponse", body) == []
    assert body["guestAttributes"][0]["queryValue"]["items"] == [{"namespace": "ns", "key": "k", "value": "v"}]


def test_errors_use_googles_error_json(url):
    status, body = _get(url + f"/v2/{P}/nodes/missing")
    assert status == 404 and body == {
        "error": {"code": 404, "message": body["error"]["message"], "status": "NOT_FOUND"}
    }
    status, body = _get(url + f"/v2/{P}/queuedResources/active", "DELETE")
    assert status == 400 and body["error"]["status"] == "FAILED_PRECONDITION"


def test_int_enums_are_ints(url):
    node = _get(url + f"/v2/{P}/nodes/n-active?$alt=json;enum-encoding=int")[1]
    assert (node["state"], node["apiVersion"], node["acceleratorConfig"]["type"]) == (2, 4, 7)
    assert _get(url + f"/v2/{P}/nodes/n-active")[1]["state"] == "READY"


def test_validator_rejects_what_the_client_would_choke_on():
    assert validate("Operation", {"name": "x", "done": True, "extra": 1}) != []
    assert validate("Node", {"state": "RUNNING"}) != []
    assert validate("Node", {"state": 11}) == []  # PREEMPTED as an int enum
    assert validate("Operation", {"response": {"@type": "type.googleapis.com/google.cloud.tpu.v2.Nope"}}) != []
