"""Multislice queued resources in the fake TPU API: Google's validation, one grant for all nodes, the repair."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import pytest
from discovery import validate
from google.auth.credentials import AnonymousCredentials
from google.cloud import tpu_v2

from infra.local.core import exceptions as exc
from infra.local.core.backend import NodeEvent
from infra.local.metadata import tpu_vm_values
from infra.local.tpu.clock import ManualClock
from infra.local.tpu.models import TpuBackend
from infra.local.tpu.server import TpuServer

ZONE = "us-central2-b"
P = f"projects/proj/locations/{ZONE}"
NODE = {"acceleratorType": "v4-16", "runtimeVersion": "tpu-ubuntu2204-base", "labels": {"run": "r"},
        "metadata": {"startup-script": "true"}}  # fmt: skip


def _ms(count: Any = 2, prefix: str | None = "ms", **extra: Any) -> dict[str, Any]:
    params: dict[str, Any] = {"nodeCount": count}
    if prefix is not None:
        params["nodeIdPrefix"] = prefix
    return {"tpu": {"nodeSpec": [{"parent": P, "multisliceParams": params, "node": NODE, **extra}]}, "spot": {}}


@pytest.fixture
def fake() -> Any:
    clock = ManualClock()
    backend = TpuBackend(clock=clock)
    events: list[NodeEvent] = []
    backend.subscribe(events.append)
    backend.events = events  # type: ignore[attr-defined]
    return backend


def _nodes(backend: TpuBackend) -> dict[str, str]:
    return {n["name"].rsplit("/", 1)[1]: n["state"] for n in backend.list_nodes(P)["nodes"]}


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (_ms(1), "nodeCount must be > 1"),
        (_ms("x"), "nodeCount must be > 1"),
        (_ms(2, "bad/prefix"), "nodeIdPrefix"),
        (_ms(2, nodeId="n"), "exactly one of nodeId and multisliceParams"),
        ({"tpu": {"nodeSpec": [{"parent": P, "node": NODE}]}}, "exactly one of nodeId and multisliceParams"),
    ],
)
def test_multislice_params_are_checked_as_google_does(fake: Any, body: dict[str, Any], words: str) -> None:
    with pytest.raises(exc.InvalidArgument, match=words):
        fake.create_queued_resource(P, "qr", body)
    assert fake.state()["queued_resources"] == 0


def test_k_nodes_granted_together_with_megascale_in_tpu_env(fake: Any) -> None:
    fake.configure_capacity({ZONE: {"spot": 8}})  # room for one v4-16 (8 chips) only: the request waits whole
    fake.create_queued_resource(P, "qr", _ms(2, None))  # the prefix defaults to the request's id
    assert fake.get_queued_resource(f"{P}/queuedResources/qr")["state"]["state"] == "WAITING_FOR_RESOURCES"
    assert _nodes(fake) == {}  # never one node without the other
    fake.configure_capacity({ZONE: {"spot": 16}})
    assert fake.get_queued_resource(f"{P}/queuedResources/qr")["state"]["state"] == "ACTIVE"
    assert _nodes(fake) == {"qr-0": "READY", "qr-1": "READY"}
    ready = {e.node_id: e.node for e in fake.events if e.kind == "ready"}
    coordinator = ready["qr-0"]["networkEndpoints"][0]["ipAddress"]
    for i in (0, 1):
        env = tpu_vm_values(ready[f"qr-{i}"], "proj", ZONE, 1)["instance/attributes/tpu-env"]
        assert f"MEGASCALE_SLICE_ID: '{i}'" in env and "MEGASCALE_NUM_SLICES: '2'" in env
        assert f"MEGASCALE_COORDINATOR_ADDRESS: '{coordinator}:8080'" in env  # slice 0, worker 0
    assert "_tpuEnv" not in fake.get_node(f"{P}/nodes/qr-1")  # the API's answer is Google's fields only
    fake.delete_queued_resource(f"{P}/queuedResources/qr", force=True)
    assert fake.state()["nodes"] == fake.state()["queued_resources"] == 0  # deleting the request deletes both


def test_a_multislice_request_fails_whole_at_valid_until(fake: Any) -> None:
    fake.configure_capacity({ZONE: {"spot": 8}})
    fake.create_queued_resource(P, "qr", {**_ms(2), "queueingPolicy": {"validUntilDuration": "5s"}})
    fake.clock.advance(6)
    assert fake.get_queued_resource(f"{P}/queuedResources/qr")["state"]["state"] == "FAILED"
    assert fake.state()["chips_in_use"] == {}  # nothing was ever held


def test_a_preempted_node_is_repaired_and_the_others_restarted(fake: Any) -> None:
    fake.set_latency(repair_s=30)
    fake.create_queued_resource(P, "qr", _ms(3))
    first = {n: fake.get_node(f"{P}/nodes/{n}")["id"] for n in ("ms-0", "ms-1", "ms-2")}
    fake.configure_capacity({ZONE: {"spot": 24}})  # exactly the three: a repair needs the lost one's chips back
    fake.events.clear()
    fake.preempt(ZONE, "ms-1")
    assert _nodes(fake) == {"ms-0": "READY", "ms-1": "PREEMPTED", "ms-2": "READY"}
    assert fake.get_queued_resource(f"{P}/queuedResources/qr")["state"]["state"] == "ACTIVE"  # not SUSPENDED
    assert [(e.kind, e.node_id) for e in fake.events] == [("stopped", "ms-1")]  # only the lost node's VMs go
    fake.clock.advance(31)
    fake.tick()
    assert _nodes(fake) == {"ms-0": "READY", "ms-1": "READY", "ms-2": "READY"}
    assert fake.get_node(f"{P}/nodes/ms-1")["id"] != first["ms-1"]  # a new node of the same name
    assert {n: fake.get_node(f"{P}/nodes/{n}")["id"] for n in ("ms-0", "ms-2")} == {
        "ms-0": first["ms-0"], "ms-2": first["ms-2"]}  # fmt: skip
    seen = [(e.kind, e.node_id, e.reason) for e in fake.events[1:]]
    assert seen[0] == ("ready", "ms-1", "created")  # the new node first, then the others restart
    assert sorted(seen[1:]) == [("ready", "ms-0", "restarted"), ("ready", "ms-2", "restarted"),
                                ("stopped", "ms-0", "restart"), ("stopped", "ms-2", "restart")]  # fmt: skip
    env = tpu_vm_values(fake.events[1].node, "proj", ZONE, 0)["instance/attributes/tpu-env"]
    assert "MEGASCALE_SLICE_ID: '1'" in env


def test_a_repair_waits_for_capacity(fake: Any) -> None:
    fake.create_queued_resource(P, "qr", _ms(2))
    fake.configure_capacity({ZONE: {"spot": 8}})  # the lost slice's hardware will be gone
    fake.preempt(ZONE, "ms-0")
    assert _nodes(fake) == {"ms-1": "READY"}  # the lost node went; no new one without capacity
    fake.configure_capacity({ZONE: {"spot": 16}})
    assert _nodes(fake) == {"ms-0": "READY", "ms-1": "READY"}
    # slice 0 came back with new addresses: the restarted node's tpu-env names the new coordinator
    new0 = fake.get_node(f"{P}/nodes/ms-0")["networkEndpoints"][0]["ipAddress"]
    restarted = [e for e in fake.events if e.kind == "ready" and e.node_id == "ms-1"][-1]
    assert restarted.reason == "restarted"
    assert restarted.node["_tpuEnv"]["MEGASCALE_COORDINATOR_ADDRESS"] == f"{new0}:8080"


def test_google_cloud_tpu_asks_for_a_multislice_and_the_answers_fit_the_discovery_document(fake: Any) -> None:
    with TpuServer(fake) as server:
        client = tpu_v2.TpuClient(
            transport="rest", credentials=AnonymousCredentials(), client_options={"api_endpoint": server.url}
        )
        params = tpu_v2.QueuedResource.Tpu.NodeSpec.MultisliceParams(node_count=2, node_id_prefix="run-a1")
        spec = tpu_v2.QueuedResource.Tpu.NodeSpec(parent=P, multislice_params=params, node=tpu_v2.Node(
            accelerator_type="v4-16", runtime_version="tpu-ubuntu2204-base"))  # fmt: skip
        qr = tpu_v2.QueuedResource(tpu=tpu_v2.QueuedResource.Tpu(node_spec=[spec]), spot=tpu_v2.QueuedResource.Spot())
        client.create_queued_resource(parent=P, queued_resource_id="run-a1", queued_resource=qr).result(timeout=10)
        got = client.get_queued_resource(name=f"{P}/queuedResources/run-a1")
        assert got.tpu.node_spec[0].multislice_params.node_count == 2 and got.state.state.name == "ACTIVE"
        assert sorted(n.name.rsplit("/", 1)[1] for n in client.list_nodes(parent=P)) == ["run-a1-0", "run-a1-1"]
        assert client.get_node(name=f"{P}/nodes/run-a1-1").multislice_node
        for schema, path in (("QueuedResource", "queuedResources/run-a1"), ("Node", "nodes/run-a1-0")):
            with urllib.request.urlopen(f"{server.url}/v2/{P}/{path}", timeout=10) as resp:
                assert validate(schema, json.loads(resp.read())) == [], path
        both = {"tpu": {"nodeSpec": [{"parent": P, "nodeId": "x", "multisliceParams": {"nodeCount": 2}, "node": NODE}]}}
        req = urllib.request.Request(
            f"{server.url}/v2/{P}/queuedResources?queuedResourceId=bad",
            method="POST",
            data=json.dumps(both).encode(),
            headers={"Content-Type": "application/json"},
        )
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(req, timeout=10)
        assert info.value.code == 400 and "exactly one of nodeId" in info.value.read().decode()
