"""The fake Cloud TPU v2 service as a thread-safe state machine, usable without HTTP.

Every public API method mirrors one REST method (same resource names, JSON in and out) and
checks injected faults against the REST path it stands for, so a scenario behaves the same
in-process and over HTTP. Time comes from a clock (``ManualClock`` in tests); state advances
lazily on every call and on ``tick()``, which the server calls on a timer.

Node lifecycle: CREATING -> READY (after ``provision_s``) -> PREEMPTED (``preempt``) / DELETING
-> gone (after ``delete_s``). Queued resource: WAITING_FOR_RESOURCES -> PROVISIONING -> ACTIVE,
or FAILED once ``queueingPolicy`` validity ends; SUSPENDED when its node is preempted or deleted
(a multislice request stays ACTIVE and is repaired: :mod:`infra.local.tpu.multislice`).
Listeners get a ``NodeEvent`` when a node becomes READY and when it stops (preempt, delete, reset),
outside the lock and in order.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from infra.local.core import exceptions as exc
from infra.local.core.clock import parse_proto_duration, parse_rfc3339
from infra.local.tpu.core import (
    ID_RE,
    BackendCore,
    Latency,
    NodeEvent,
    Project,
    page,
    split_name,
    split_parent,
)
from infra.local.tpu.multislice import expand
from infra.local.tpu.records import (
    ACCEL_CONFIG_TYPE,
    QR_TYPE,
    Node,
    NodeState,
    QrState,
    QueuedResource,
    parent_of,
)
from tpu_ops.accelerators import ACCELERATOR_TYPES, RUNTIME_VERSIONS
from tpu_ops.tiers import Tier

__all__ = ["Latency", "NodeEvent", "TpuBackend"]


class TpuBackend(BackendCore):
    """All projects and zones of the fake service. Thread-safe; see the module docstring."""

    # -- nodes ---------------------------------------------------------------------------
    def create_node(self, parent: str, node_id: str, body: dict[str, Any]) -> dict[str, Any]:
        project, zone = split_parent(parent)

        def run() -> dict[str, Any]:
            accel = self._check_node_body(node_id, body)
            p = self._proj(project)
            if (zone, node_id) in p.nodes or self._pending_node_ids(p, zone, node_id):
                raise exc.AlreadyExists(f"node {parent}/nodes/{node_id} already exists")
            sched = body.get("schedulingConfig") or {}
            kind = (
                Tier.SPOT
                if sched.get("spot") or sched.get("preemptible")
                else Tier.RESERVATION
                if sched.get("reserved")
                else Tier.ON_DEMAND
            )
            now = self.clock.now()
            op = self._new_op(project, zone, "create", f"{parent}/nodes/{node_id}")
            pool = self._free_pool(zone, kind, "-", accel.chips)
            if pool is None:
                # A direct create does not queue: its operation fails at once (code 8).
                op.finish(now, error=exc.ResourceExhausted(
                    f"There is no more capacity in the zone {zone!r} for {accel.name} ({kind}); "
                    "you can try again later or use a queued resource"
                ).to_status())  # fmt: skip
                return op.to_json()
            p.nodes[(zone, node_id)] = self._make_node(project, zone, node_id, body, accel, pool, now)
            return op.to_json()

        return self._call("POST", f"/v2/{parent}/nodes", run)

    def _pending_node_ids(self, p: Project, zone: str, node_id: str) -> bool:
        return any(
            qr.zone == zone and not qr.node_names and x.node_id == node_id and qr.state == QrState.WAITING
            for qr in p.qrs.values()
            for x in qr.planned
        )

    def _node(self, name: str) -> Node:
        project, zone, node_id = split_name(name, "nodes")
        node = self._proj(project).nodes.get((zone, node_id))
        if node is None:
            raise exc.NotFound(f"node {name!r} not found")
        return node

    def get_node(self, name: str) -> dict[str, Any]:
        return self._call("GET", f"/v2/{name}", lambda: self._node(name).to_json())

    def _list(self, parent: str, collection: str, page_size: int | None, page_token: str | None) -> dict[str, Any]:
        """One page of ``nodes``, ``queuedResources`` or ``operations`` under ``parent`` (zone ``-`` = all)."""
        project, zone = split_parent(parent)
        attr = {"nodes": "nodes", "queuedResources": "qrs", "operations": "ops"}[collection]

        def run() -> dict[str, Any]:
            table: dict[tuple[str, str], Any] = getattr(self._proj(project), attr)
            items = sorted((v for (z, _), v in table.items() if zone in ("-", z)), key=lambda v: v.name)
            chunk, token = page(items, page_size, page_token)
            out: dict[str, Any] = {collection: [v.to_json() for v in chunk]}
            if token:
                out["nextPageToken"] = token
            return out

        return self._call("GET", f"/v2/{parent}/{collection}", run)

    def list_nodes(self, parent: str, page_size: int | None = None, page_token: str | None = None) -> dict[str, Any]:
        return self._list(parent, "nodes", page_size, page_token)

    def delete_node(self, name: str) -> dict[str, Any]:
        def run() -> dict[str, Any]:
            node = self._node(name)
            op = self._new_op(node.project, node.zone, "delete", name)
            self._start_delete(node, "deleted")
            p = self._proj(node.project)
            qr = p.qrs.get((node.zone, node.queued_resource.rsplit("/", 1)[-1])) if node.queued_resource else None
            if qr is not None and qr.state in (QrState.PROVISIONING, QrState.ACTIVE):
                qr.state, qr.initiator = QrState.SUSPENDED, "USER"
            return op.to_json()

        return self._call("DELETE", f"/v2/{name}", run)

    def get_guest_attributes(self, name: str, query_path: str = "", worker_ids: Iterable[str] = ()) -> dict[str, Any]:
        def run() -> dict[str, Any]:
            node = self._node(name)
            workers = [int(w) for w in worker_ids] or list(range(node.hosts))
            out = []
            for w in workers:
                items = [
                    {"namespace": ns, "key": key, "value": value}
                    for (wid, ns, key), value in sorted(node.guest_attributes.items())
                    if wid == w and f"{ns}/{key}".startswith(query_path)
                ]
                out.append({"queryPath": query_path, "queryValue": {"items": items}})
            return {"guestAttributes": out}

        return self._call("POST", f"/v2/{name}:getGuestAttributes", run)

    def set_guest_attribute(self, name: str, worker: int, namespace: str, key: str, value: str) -> None:
        """What a VM's metadata server does on ``PUT instance/guest-attributes/<ns>/<key>``."""
        with self._lock:
            self._node(name).guest_attributes[(worker, namespace, key)] = value

    # -- queued resources ------------------------------------------------------------------
    def create_queued_resource(
        self, parent: str, qr_id: str, body: dict[str, Any], request_id: str = ""
    ) -> dict[str, Any]:
        project, zone = split_parent(parent)

        def run() -> dict[str, Any]:
            p = self._proj(project)
            existing = p.qrs.get((zone, qr_id))
            if existing is not None:
                if request_id and existing.request_id == request_id:
                    return p.ops[(zone, existing.create_op)].to_json()  # idempotent retry
                raise exc.AlreadyExists(f"queued resource {parent}/queuedResources/{qr_id} already exists")
            qr = self._new_qr(project, zone, qr_id, body, request_id)
            op = self._new_op(project, zone, "create", qr.name)
            qr.create_op = op.op_id
            p.qrs[(zone, qr_id)] = qr
            op.finish(qr.create_time, response={"@type": QR_TYPE, **qr.to_json()})
            return op.to_json()

        return self._call("POST", f"/v2/{parent}/queuedResources", run)

    def _new_qr(self, project: str, zone: str, qr_id: str, body: dict[str, Any], request_id: str) -> QueuedResource:
        if not qr_id or not ID_RE.match(qr_id):
            raise exc.InvalidArgument(f"invalid queued resource id {qr_id!r}")
        specs = body.get("tpu", {}).get("nodeSpec") or []
        if not specs:
            raise exc.InvalidArgument("queuedResource.tpu.nodeSpec must name at least one node")
        p = self._proj(project)
        for s in specs:
            if s.get("parent", parent_of(project, zone)) != parent_of(project, zone):
                raise exc.InvalidArgument(f"nodeSpec.parent must be {parent_of(project, zone)}")
        planned = expand(qr_id, specs)
        for x in planned:
            self._check_node_body(x.node_id, x.body)
            if (zone, x.node_id) in p.nodes or self._pending_node_ids(p, zone, x.node_id):
                raise exc.AlreadyExists(f"node {x.node_id} already exists in {zone}")
        tiers = [t for t in ("spot", "guaranteed", "reservationName") if t in body]
        if len(tiers) > 1:
            raise exc.InvalidArgument(f"set at most one of spot, guaranteed, reservationName (got {tiers})")
        kind, reservation = Tier.ON_DEMAND, ""
        if "spot" in body:
            kind = Tier.SPOT
        elif "reservationName" in body:
            m = re.match(r"^projects/[^/]+/locations/([^/]+)/reservations/([^/]+)$", str(body["reservationName"]))
            if not m or m.group(1) != zone:
                raise exc.InvalidArgument(f"reservationName must be projects/*/locations/{zone}/reservations/*")
            kind, reservation = Tier.RESERVATION, m.group(2)
            if not self.capacity.has_reservation(zone, reservation):
                raise exc.NotFound(f"reservation {body['reservationName']!r} not found in {zone}")
        now = self.clock.now()
        spec = {
            k: v for k, v in body.items() if k in ("tpu", "spot", "guaranteed", "reservationName", "queueingPolicy")
        }
        qr = QueuedResource(project, zone, qr_id, spec, kind, reservation, now, request_id=request_id, planned=planned)
        policy = body.get("queueingPolicy") or {}
        if "validUntilDuration" in policy:
            qr.valid_until = now + parse_proto_duration(policy["validUntilDuration"])
        elif "validUntilTime" in policy:
            qr.valid_until = parse_rfc3339(policy["validUntilTime"])
        if "validAfterDuration" in policy:
            qr.valid_after = now + parse_proto_duration(policy["validAfterDuration"])
        elif "validAfterTime" in policy:
            qr.valid_after = parse_rfc3339(policy["validAfterTime"])
        return qr

    def _qr(self, name: str) -> QueuedResource:
        project, zone, qr_id = split_name(name, "queuedResources")
        qr = self._proj(project).qrs.get((zone, qr_id))
        if qr is None:
            raise exc.NotFound(f"queued resource {name!r} not found")
        return qr

    def get_queued_resource(self, name: str) -> dict[str, Any]:
        return self._call("GET", f"/v2/{name}", lambda: self._qr(name).to_json())

    def list_queued_resources(
        self, parent: str, page_size: int | None = None, page_token: str | None = None
    ) -> dict[str, Any]:
        return self._list(parent, "queuedResources", page_size, page_token)

    def _qr_nodes(self, qr: QueuedResource) -> list[Node]:
        p = self._proj(qr.project)
        found = (p.nodes.get((qr.zone, n.rsplit("/", 1)[1])) for n in qr.node_names)
        return [n for n in found if n is not None]

    def delete_queued_resource(self, name: str, force: bool = False) -> dict[str, Any]:
        def run() -> dict[str, Any]:
            qr = self._qr(name)
            nodes = self._qr_nodes(qr)
            if nodes and not force:
                raise exc.FailedPrecondition(
                    f"queued resource {name} in state {qr.state} still has node(s) "
                    f"{', '.join(n.node_id for n in nodes)}; delete them first or set force=true"
                )
            op = self._new_op(qr.project, qr.zone, "delete", name)
            qr.state, qr.initiator = QrState.DELETING, "USER"
            for node in nodes:
                self._start_delete(node, "deleted")
            return op.to_json()

        return self._call("DELETE", f"/v2/{name}", run)

    def reset_queued_resource(self, name: str) -> dict[str, Any]:
        def run() -> dict[str, Any]:
            qr = self._qr(name)
            if qr.state not in QrState.RESETTABLE:
                raise exc.FailedPrecondition(f"queued resource {name} in state {qr.state} cannot be reset")
            p = self._proj(qr.project)
            for node in self._qr_nodes(qr):
                self._start_delete(node, "reset")
                del p.nodes[(node.zone, node.node_id)]  # reset frees the slice at once
            qr.node_names.clear()
            qr.state, qr.initiator, qr.error = QrState.WAITING, "USER", None
            op = self._new_op(qr.project, qr.zone, "reset", name)
            op.finish(self.clock.now(), response={"@type": QR_TYPE, **qr.to_json()})
            return op.to_json()

        return self._call("POST", f"/v2/{name}:reset", run)

    # -- operations and catalogs ---------------------------------------------------------
    def get_operation(self, name: str) -> dict[str, Any]:
        def run() -> dict[str, Any]:
            project, zone, op_id = split_name(name, "operations")
            op = self._proj(project).ops.get((zone, op_id))
            if op is None:
                raise exc.NotFound(f"operation {name!r} not found")
            return op.to_json()

        return self._call("GET", f"/v2/{name}", run)

    def list_operations(
        self, parent: str, page_size: int | None = None, page_token: str | None = None
    ) -> dict[str, Any]:
        return self._list(parent, "operations", page_size, page_token)

    def _catalog(self, parent: str, collection: str) -> list[dict[str, Any]]:
        split_parent(parent)
        if collection == "acceleratorTypes":
            return [
                {
                    "name": f"{parent}/acceleratorTypes/{a.name}",
                    "type": a.name,
                    "acceleratorConfigs": [{"type": ACCEL_CONFIG_TYPE[a.generation], "topology": a.topology}],
                }
                for a in sorted(ACCELERATOR_TYPES.values(), key=lambda a: a.name)
                if a.generation in ACCEL_CONFIG_TYPE  # TPU7x is Compute Engine only
            ]
        versions = sorted({v for vs in RUNTIME_VERSIONS.values() for v in vs})
        return [{"name": f"{parent}/runtimeVersions/{v}", "version": v} for v in versions]

    def list_catalog(
        self, parent: str, collection: str, page_size: int | None = None, page_token: str | None = None
    ) -> dict[str, Any]:
        """``acceleratorTypes`` or ``runtimeVersions`` of a zone (from the tpu_ops table)."""

        def run() -> dict[str, Any]:
            chunk, token = page(self._catalog(parent, collection), page_size, page_token)
            out: dict[str, Any] = {collection: chunk}
            if token:
                out["nextPageToken"] = token
            return out

        return self._call("GET", f"/v2/{parent}/{collection}", run)

    def get_catalog(self, name: str, collection: str) -> dict[str, Any]:
        def run() -> dict[str, Any]:
            project, zone, _ = split_name(name, collection)
            for item in self._catalog(parent_of(project, zone), collection):
                if item["name"] == name:
                    return item
            raise exc.NotFound(f"{name!r} not found")

        return self._call("GET", f"/v2/{name}", run)

    # -- control (what /_fake/* exposes) ---------------------------------------------------
    def preempt(self, zone: str, node_id: str, project: str | None = None) -> dict[str, Any]:
        """Spot preemption: node PREEMPTED (still holding its chips), its queued resource SUSPENDED."""
        try:
            with self._lock:
                self._advance()
                projects = [project] if project else list(self._projects)
                node = next((self._projects[p].nodes[(zone, node_id)] for p in projects
                             if p in self._projects and (zone, node_id) in self._projects[p].nodes), None)  # fmt: skip
                if node is None or node.state not in (NodeState.CREATING, NodeState.READY):
                    raise exc.NotFound(f"no running node {node_id!r} in {zone}")
                node.state = NodeState.PREEMPTED
                self._emit("stopped", "preempted", node)
                if node.queued_resource:
                    qr = self._proj(node.project).qrs.get((zone, node.queued_resource.rsplit("/", 1)[1]))
                    if qr is not None and qr.multislice and qr.state == QrState.ACTIVE:
                        qr.repair_at = self.clock.now() + self.latency.repair_s  # Google repairs it
                    elif qr is not None and qr.state in (QrState.PROVISIONING, QrState.ACTIVE):
                        qr.state, qr.initiator = QrState.SUSPENDED, "SERVICE"
                self._advance()
                return node.to_json()
        finally:
            self._flush()

    def configure_capacity(self, spec: dict[str, Any]) -> None:
        try:
            with self._lock:
                self.capacity.configure(spec)
                self._advance()  # freed capacity may unblock waiting requests
        finally:
            self._flush()

    def set_latency(
        self, provision_s: float | None = None, delete_s: float | None = None, repair_s: float | None = None
    ) -> None:
        with self._lock:
            for key, value in (("provision_s", provision_s), ("delete_s", delete_s), ("repair_s", repair_s)):
                if value is not None:
                    setattr(self.latency, key, value)

    def reset(self) -> None:
        """Forget everything (stopping every running node first); capacity and latency to defaults."""
        try:
            with self._lock:
                for p in self._projects.values():
                    for node in p.nodes.values():
                        if node.state in (NodeState.CREATING, NodeState.READY):
                            self._emit("stopped", "reset", node)
                self._projects.clear()
                self._faults.clear()
                self.capacity.zones.clear()
                self.latency = Latency(**vars(self._initial_latency))
        finally:
            self._flush()

    def state(self) -> dict[str, Any]:
        """Counts by state plus capacity in use: what tests assert "nothing left" on."""
        with self._lock:
            self._advance()
            nodes = [n for p in self._projects.values() for n in p.nodes.values()]
            qrs = [q for p in self._projects.values() for q in p.qrs.values()]
            used: dict[str, dict[str, int]] = {}
            for n in nodes:
                key = n.pool[0] if not n.pool[1] else f"{n.pool[0]}/{n.pool[1]}"
                used.setdefault(n.zone, {}).setdefault(key, 0)
                used[n.zone][key] += n.accel.chips
            return {
                "nodes": len(nodes),
                "queued_resources": len(qrs),
                "operations": sum(len(p.ops) for p in self._projects.values()),
                "node_states": {n.name: n.state for n in nodes},
                "queued_resource_states": {q.name: q.state for q in qrs},
                "chips_in_use": used,
                "capacity": self.capacity.to_json(),
                "faults_pending": self.faults_pending(),
            }
