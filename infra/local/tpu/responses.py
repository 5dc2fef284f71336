"""HTTP layer of the fake TPU API: parse requests, call ``TpuBackend``, render Google-style JSON.

No state lives here. Errors use Google's error JSON; ``$alt=json;enum-encoding=int`` (what the
Python client sends) switches enums in responses to their integer values, as Google does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from werkzeug.wrappers import Request

from infra.local.core import exceptions as exc
from infra.local.core.responses import ControlMixin, JsonApp
from infra.local.tpu import locations, urls
from infra.local.tpu.models import TpuBackend

LogsProvider = Callable[[str, str], dict[str, Any]]

# Integer values of the enums the v2 API returns (google.cloud.tpu.v2 protos).
_NODE_STATE = {
    "STATE_UNSPECIFIED": 0, "CREATING": 1, "READY": 2, "RESTARTING": 3, "REIMAGING": 4, "DELETING": 5,
    "REPAIRING": 6, "STOPPED": 8, "STOPPING": 9, "STARTING": 10, "PREEMPTED": 11, "TERMINATED": 12,
    "HIDING": 13, "HIDDEN": 14, "UNHIDING": 15, "UNKNOWN": 16,
}  # fmt: skip
_QR_STATE = {
    "STATE_UNSPECIFIED": 0, "CREATING": 1, "ACCEPTED": 2, "PROVISIONING": 3, "FAILED": 4, "DELETING": 5,
    "ACTIVE": 6, "SUSPENDING": 7, "SUSPENDED": 8, "WAITING_FOR_RESOURCES": 9,
}  # fmt: skip
_INITIATOR = {"STATE_INITIATOR_UNSPECIFIED": 0, "USER": 1, "SERVICE": 2}
_HEALTH = {"HEALTH_UNSPECIFIED": 0, "HEALTHY": 1, "TIMEOUT": 3, "UNHEALTHY_TENSORFLOW": 4, "UNHEALTHY_MAINTENANCE": 5}
_API_VERSION = {"API_VERSION_UNSPECIFIED": 0, "V1_ALPHA1": 1, "V1": 2, "V2_ALPHA1": 3, "V2": 4}
_ACCEL_TYPE = {"TYPE_UNSPECIFIED": 0, "V2": 2, "V3": 4, "V4": 7, "V5LITE_POD": 9, "V5P": 10, "V6E": 11}
ENUMS = {"node_state": _NODE_STATE, "qr_state": _QR_STATE, "initiator": _INITIATOR, "health": _HEALTH,
         "api_version": _API_VERSION, "accel_type": _ACCEL_TYPE}  # fmt: skip


def _int(table: dict[str, int], value: Any) -> Any:
    return table.get(value, value) if isinstance(value, str) else value


def _node_ints(n: dict[str, Any]) -> dict[str, Any]:
    n = dict(n)
    for key, table in (("state", _NODE_STATE), ("health", _HEALTH), ("apiVersion", _API_VERSION)):
        if key in n:
            n[key] = _int(table, n[key])
    if "acceleratorConfig" in n:
        n["acceleratorConfig"] = {
            **n["acceleratorConfig"],
            "type": _int(_ACCEL_TYPE, n["acceleratorConfig"].get("type")),
        }
    return n


def _qr_ints(q: dict[str, Any]) -> dict[str, Any]:
    q = dict(q)
    if isinstance(q.get("state"), dict):
        st = dict(q["state"])
        st["state"] = _int(_QR_STATE, st.get("state"))
        st["stateInitiator"] = _int(_INITIATOR, st.get("stateInitiator"))
        q["state"] = st
    if "tpu" in q:
        specs = [{**s, "node": _node_ints(s.get("node", {}))} for s in q["tpu"].get("nodeSpec", [])]
        q["tpu"] = {**q["tpu"], "nodeSpec": specs}
    return q


def int_enums(body: dict[str, Any]) -> dict[str, Any]:
    """Rewrite enum names as integers in any response body of this API."""
    out = dict(body)
    if "nodes" in out:
        out["nodes"] = [_node_ints(n) for n in out["nodes"]]
    if "queuedResources" in out:
        out["queuedResources"] = [_qr_ints(q) for q in out["queuedResources"]]
    if "operations" in out:
        out["operations"] = [int_enums(o) for o in out["operations"]]
    if "acceleratorTypes" in out:
        out["acceleratorTypes"] = [int_enums(a) for a in out["acceleratorTypes"]]
    if "acceleratorConfigs" in out:
        out["acceleratorConfigs"] = [{**c, "type": _int(_ACCEL_TYPE, c.get("type"))} for c in out["acceleratorConfigs"]]
    resp = out.get("response")
    if isinstance(resp, dict):
        out["response"] = _node_ints(resp) if resp.get("@type", "").endswith(".Node") else _qr_ints(resp)
    if "name" in out and "/nodes/" in str(out["name"]) and "state" in out:
        out = _node_ints(out)
    if "name" in out and "/queuedResources/" in str(out["name"]):
        out = _qr_ints(out)
    return out


class TpuResponses(ControlMixin, JsonApp):
    """A WSGI application serving ``backend`` with Google's URL scheme and JSON."""

    routes = urls.ROUTES
    backend: TpuBackend

    def __init__(self, backend: TpuBackend, logs: LogsProvider | None = None) -> None:
        self.backend = backend
        self.logs = logs

    def dispatch(self, req: Request, handler: str, args: dict[str, str]) -> Any:
        body = super().dispatch(req, handler, args)
        if "enum-encoding=int" in req.args.get("$alt", "") and isinstance(body, dict):
            body = int_enums(body)
        return body

    @staticmethod
    def _page_size(req: Request) -> int | None:
        raw = req.args.get("pageSize")
        return int(raw) if raw else None

    # -- API ------------------------------------------------------------------------------
    def list_nodes(self, req: Request, parent: str) -> dict[str, Any]:
        return self.backend.list_nodes(parent, self._page_size(req), req.args.get("pageToken"))

    def create_node(self, req: Request, parent: str) -> dict[str, Any]:
        return self.backend.create_node(parent, req.args.get("nodeId", ""), self._body(req))

    def get_node(self, req: Request, name: str) -> dict[str, Any]:
        return self.backend.get_node(name)

    def delete_node(self, req: Request, name: str) -> dict[str, Any]:
        return self.backend.delete_node(name)

    def get_guest_attributes(self, req: Request, name: str) -> dict[str, Any]:
        body = self._body(req)
        return self.backend.get_guest_attributes(name, body.get("queryPath", ""), body.get("workerIds", []))

    def list_queued_resources(self, req: Request, parent: str) -> dict[str, Any]:
        return self.backend.list_queued_resources(parent, self._page_size(req), req.args.get("pageToken"))

    def create_queued_resource(self, req: Request, parent: str) -> dict[str, Any]:
        return self.backend.create_queued_resource(
            parent, req.args.get("queuedResourceId", ""), self._body(req), req.args.get("requestId", "")
        )

    def get_queued_resource(self, req: Request, name: str) -> dict[str, Any]:
        return self.backend.get_queued_resource(name)

    def delete_queued_resource(self, req: Request, name: str) -> dict[str, Any]:
        return self.backend.delete_queued_resource(name, force=req.args.get("force", "").lower() in ("true", "1"))

    def reset_queued_resource(self, req: Request, name: str) -> dict[str, Any]:
        return self.backend.reset_queued_resource(name)

    def list_operations(self, req: Request, parent: str) -> dict[str, Any]:
        return self.backend.list_operations(parent, self._page_size(req), req.args.get("pageToken"))

    def get_operation(self, req: Request, name: str) -> dict[str, Any]:
        return self.backend.get_operation(name)

    def list_catalog(self, req: Request, parent: str, collection: str) -> dict[str, Any]:
        return self.backend.list_catalog(parent, collection, self._page_size(req), req.args.get("pageToken"))

    def get_catalog(self, req: Request, name: str, collection: str) -> dict[str, Any]:
        return self.backend.get_catalog(name, collection)

    def list_locations(self, req: Request, project: str) -> dict[str, Any]:
        return locations.list_locations(self.backend, project)

    def list_reservations(self, req: Request, parent: str) -> dict[str, Any]:
        return locations.list_reservations(self.backend, parent)

    # -- control ----------------------------------------------------------------------------
    def fake_preempt(self, req: Request, zone: str, node: str) -> dict[str, Any]:
        return self.backend.preempt(zone, node, req.args.get("project") or None)

    def fake_get_capacity(self, req: Request) -> dict[str, Any]:
        return self.backend.capacity.to_json()

    def fake_capacity(self, req: Request) -> dict[str, Any]:
        self.backend.configure_capacity(self._body(req))
        return self.backend.capacity.to_json()

    def fake_latency(self, req: Request) -> dict[str, Any]:
        body = self._body(req)
        self.backend.set_latency(body.get("provision_s"), body.get("delete_s"), body.get("repair_s"))
        return dict(vars(self.backend.latency))

    def fake_logs(self, req: Request, zone: str, node: str) -> dict[str, Any]:
        if self.logs is None:
            raise exc.FailedPrecondition("no host simulator attached to this server")
        return self.logs(zone, node)
