"""One small driver per implementation of the fake TPU API, so one scenario suite runs on both.

``InProcess`` calls ``TpuBackend`` directly; ``OverHttp`` goes through Google's own
``google.cloud.tpu_v2.TpuClient`` (REST transport) and the server's ``/_fake`` control endpoints.
Both return plain values (state names, counts) and raise ``ApiError(status)``.
"""

from __future__ import annotations

import json
import urllib.request
from typing import Any

from google.api_core import exceptions as gexc
from google.api_core.retry import Retry, if_exception_type
from google.auth.credentials import AnonymousCredentials
from google.cloud import tpu_v2

from infra.local.tpu import exceptions as exc
from infra.local.tpu.clock import ManualClock
from infra.local.tpu.models import TpuBackend

PROJECT = "proj"
RUNTIME = "tpu-ubuntu2204-base"


class ApiError(Exception):
    def __init__(self, status: str, message: str = "") -> None:
        super().__init__(f"{status}: {message}")
        self.status = status


def parent(zone: str) -> str:
    return f"projects/{PROJECT}/locations/{zone}"


def qr_body(zone: str, node_id: str, accel: str, tier: str, labels: dict[str, str], valid_for: str | None) -> dict:
    body: dict[str, Any] = {
        "tpu": {"nodeSpec": [{"parent": parent(zone), "nodeId": node_id,
                              "node": {"acceleratorType": accel, "runtimeVersion": RUNTIME, "labels": labels}}]}
    }  # fmt: skip
    if tier == "spot":
        body["spot"] = {}
    elif tier == "guaranteed":
        body["guaranteed"] = {}
    elif tier.startswith("reservation:"):
        body["reservationName"] = f"{parent(zone)}/reservations/{tier.split(':', 1)[1]}"
    if valid_for:
        body["queueingPolicy"] = {"validUntilDuration": valid_for}
    return body


def _status_of(e: gexc.GoogleAPICallError) -> str:
    """Canonical status: from Google's error JSON over HTTP, else from an operation's gRPC code."""
    resp = getattr(e, "response", None)
    if resp is not None and hasattr(resp, "json"):
        try:
            return str(resp.json()["error"]["status"])
        except (ValueError, KeyError, TypeError):
            pass
    return e.grpc_status_code.name if e.grpc_status_code else str(e.code)


class InProcess:
    name = "inprocess"

    def __init__(self, backend: TpuBackend, clock: ManualClock) -> None:
        self.backend, self.clock = backend, clock

    def _do(self, fn: Any, *a: Any, **kw: Any) -> Any:
        try:
            return fn(*a, **kw)
        except exc.TpuApiError as e:
            raise ApiError(e.status, e.message) from e

    def _wait(self, op: dict) -> dict:
        while not op.get("done"):
            self.clock.advance(1)
            op = self._do(self.backend.get_operation, op["name"])
        if "error" in op:
            status = {c: n for n, (c, _) in exc.CODES.items()}[op["error"]["code"]]
            raise ApiError(status, op["error"]["message"])
        return op["response"]

    def create_qr(
        self,
        zone: str,
        qr_id: str,
        node_id: str,
        accel: str = "v4-8",
        tier: str = "spot",
        labels: dict[str, str] | None = None,
        valid_for: str | None = None,
        retry: bool = False,
    ) -> str:
        body = qr_body(zone, node_id, accel, tier, labels or {}, valid_for)
        while True:
            try:
                op = self._do(self.backend.create_queued_resource, parent(zone), qr_id, body, "req-" + qr_id)
                return str(self._wait(op)["name"])
            except ApiError as e:
                if not (retry and e.status == "UNAVAILABLE"):
                    raise

    def create_node(self, zone: str, node_id: str, accel: str = "v4-8", spot: bool = False) -> str:
        body = {"acceleratorType": accel, "runtimeVersion": RUNTIME, "schedulingConfig": {"spot": spot}}
        return str(self._wait(self._do(self.backend.create_node, parent(zone), node_id, body))["state"])

    def qr_state(self, zone: str, qr_id: str) -> str:
        return str(
            self._do(self.backend.get_queued_resource, f"{parent(zone)}/queuedResources/{qr_id}")["state"]["state"]
        )

    def node(self, zone: str, node_id: str) -> dict[str, Any]:
        n = self._do(self.backend.get_node, f"{parent(zone)}/nodes/{node_id}")
        return {"state": n["state"], "endpoints": len(n["networkEndpoints"]), "labels": n.get("labels", {}),
                "queued_resource": n.get("queuedResource", "")}  # fmt: skip

    def list_node_pages(self, zone: str, page_size: int) -> list[list[str]]:
        pages, token = [], ""
        while True:
            resp = self._do(self.backend.list_nodes, parent(zone), page_size, token)
            pages.append([n["name"].rsplit("/", 1)[1] for n in resp["nodes"]])
            token = resp.get("nextPageToken", "")
            if not token:
                return pages

    def delete_qr(self, zone: str, qr_id: str, force: bool = False) -> None:
        self._wait(self._do(self.backend.delete_queued_resource, f"{parent(zone)}/queuedResources/{qr_id}", force))

    def delete_node(self, zone: str, node_id: str) -> None:
        self._wait(self._do(self.backend.delete_node, f"{parent(zone)}/nodes/{node_id}"))

    # control
    def preempt(self, zone: str, node_id: str) -> None:
        self.backend.preempt(zone, node_id)

    def capacity(self, spec: dict[str, Any]) -> None:
        self.backend.configure_capacity(spec)

    def fault(self, path: str, status: int, count: int) -> None:
        self.backend.add_fault(path, status, count)

    def state(self) -> dict[str, Any]:
        return self.backend.state()

    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)
        self.backend.tick()


class OverHttp(InProcess):
    name = "http"

    def __init__(self, backend: TpuBackend, clock: ManualClock, url: str) -> None:
        super().__init__(backend, clock)
        self.url = url
        self.client = tpu_v2.TpuClient(
            transport="rest", credentials=AnonymousCredentials(), client_options={"api_endpoint": url}
        )

    def _do(self, fn: Any, *a: Any, **kw: Any) -> Any:
        try:
            return fn(*a, **kw)
        except gexc.GoogleAPICallError as e:
            raise ApiError(_status_of(e), e.message) from e

    def _result(self, op: Any) -> Any:
        # The manual clock only moves when we move it: poll the operation ourselves.
        while not op.done():
            self.clock.advance(1)
        return self._do(op.result, timeout=10)

    def _control(self, method: str, path: str, body: Any = None) -> Any:
        data = json.dumps(body).encode() if body is not None else b""
        req = urllib.request.Request(self.url + path, data=data, method=method)
        with urllib.request.urlopen(req, timeout=10) as resp:
            return json.loads(resp.read())

    def create_qr(
        self,
        zone: str,
        qr_id: str,
        node_id: str,
        accel: str = "v4-8",
        tier: str = "spot",
        labels: dict[str, str] | None = None,
        valid_for: str | None = None,
        retry: bool = False,
    ) -> str:
        body = qr_body(zone, node_id, accel, tier, labels or {}, valid_for)
        qr = tpu_v2.QueuedResource.from_json(json.dumps(body))
        req = tpu_v2.CreateQueuedResourceRequest(
            parent=parent(zone), queued_resource_id=qr_id, queued_resource=qr, request_id="req-" + qr_id
        )
        # The client has no default retry for this method: pass its own Retry (api_core), as callers do.
        policy = Retry(if_exception_type(gexc.ServiceUnavailable), initial=0.01, maximum=0.05, timeout=10)
        op = self._do(self.client.create_queued_resource, request=req, retry=policy if retry else None)
        return str(self._result(op).name)

    def create_node(self, zone: str, node_id: str, accel: str = "v4-8", spot: bool = False) -> str:
        node = tpu_v2.Node(accelerator_type=accel, runtime_version=RUNTIME,
                           scheduling_config=tpu_v2.SchedulingConfig(spot=spot))  # fmt: skip
        op = self._do(self.client.create_node, parent=parent(zone), node_id=node_id, node=node)
        return str(self._result(op).state.name)

    def qr_state(self, zone: str, qr_id: str) -> str:
        qr = self._do(self.client.get_queued_resource, name=f"{parent(zone)}/queuedResources/{qr_id}")
        return str(qr.state.state.name)

    def node(self, zone: str, node_id: str) -> dict[str, Any]:
        n = self._do(self.client.get_node, name=f"{parent(zone)}/nodes/{node_id}")
        return {"state": n.state.name, "endpoints": len(n.network_endpoints), "labels": dict(n.labels),
                "queued_resource": n.queued_resource}  # fmt: skip

    def list_node_pages(self, zone: str, page_size: int) -> list[list[str]]:
        pager = self._do(
            self.client.list_nodes, request=tpu_v2.ListNodesRequest(parent=parent(zone), page_size=page_size)
        )
        return [[n.name.rsplit("/", 1)[1] for n in page.nodes] for page in pager.pages]

    def delete_qr(self, zone: str, qr_id: str, force: bool = False) -> None:
        req = tpu_v2.DeleteQueuedResourceRequest(name=f"{parent(zone)}/queuedResources/{qr_id}", force=force)
        self._result(self._do(self.client.delete_queued_resource, request=req))

    def delete_node(self, zone: str, node_id: str) -> None:
        self._result(self._do(self.client.delete_node, name=f"{parent(zone)}/nodes/{node_id}"))

    def preempt(self, zone: str, node_id: str) -> None:
        self._control("POST", f"/_fake/nodes/{zone}/{node_id}:preempt")

    def capacity(self, spec: dict[str, Any]) -> None:
        self._control("POST", "/_fake/capacity", spec)

    def fault(self, path: str, status: int, count: int) -> None:
        self._control("POST", "/_fake/faults", {"path": path, "status": status, "count": count})

    def state(self) -> dict[str, Any]:
        return dict(self._control("GET", "/_fake/state"))
