"""Core of the fake TPU service: records by project, events, faults, time-driven state machines.

Split from :mod:`infra.local.tpu.models` (which holds the API methods) to keep modules small.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field
from typing import Any

from infra.local.core import exceptions as exc
from infra.local.core.backend import FakeBackend, Fault, NodeEvent, operation_id, page
from infra.local.core.clock import Clock
from infra.local.tpu.capacity import Capacity, Pool
from infra.local.tpu.multislice import megascale_env
from infra.local.tpu.records import (
    ACCEL_CONFIG_TYPE,
    EMPTY_TYPE,
    NODE_INPUT_FIELDS,
    NODE_TYPE,
    Node,
    NodeState,
    Operation,
    QrState,
    QueuedResource,
)
from tpu_ops.accelerators import ACCELERATOR_TYPES, AcceleratorType, lookup
from tpu_ops.tiers import Tier

ID_RE = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
_NAME_RE = re.compile(r"^projects/([^/]+)/locations/([^/]+)/(\w+)/([^/:]+)$")
_PARENT_RE = re.compile(r"^projects/([^/]+)/locations/([^/]+)$")
_GEN_BY_CONFIG_TYPE = {v: k for k, v in ACCEL_CONFIG_TYPE.items()}
_CONFIG_TYPE_INTS = {2: "V2", 4: "V3", 7: "V4", 9: "V5LITE_POD", 10: "V5P", 11: "V6E"}

__all__ = ["Fault", "NodeEvent", "page"]  # re-exported for infra.local.tpu.models


@dataclass
class Latency:
    provision_s: float = 0.0  # node CREATING -> READY
    delete_s: float = 0.0  # node DELETING -> gone
    repair_s: float = 0.0  # a multislice node preempted -> Google starts its repair (infra.local.tpu.multislice)


@dataclass
class Project:
    nodes: dict[tuple[str, str], Node] = field(default_factory=dict)  # (zone, id)
    qrs: dict[tuple[str, str], QueuedResource] = field(default_factory=dict)
    ops: dict[tuple[str, str], Operation] = field(default_factory=dict)


def split_name(name: str, collection: str) -> tuple[str, str, str]:
    m = _NAME_RE.match(name)
    if not m or m.group(3) != collection:
        raise exc.InvalidArgument(f"invalid resource name {name!r}")
    return m.group(1), m.group(2), m.group(4)


def split_parent(parent: str) -> tuple[str, str]:
    m = _PARENT_RE.match(parent)
    if not m:
        raise exc.InvalidArgument(f"invalid parent {parent!r}")
    return m.group(1), m.group(2)


class BackendCore(FakeBackend[NodeEvent]):
    """State and the time-driven state machines; the API methods are in ``TpuBackend``."""

    def __init__(
        self, *, clock: Clock | None = None, latency: Latency | None = None, capacity: Capacity | None = None
    ) -> None:
        super().__init__(clock=clock)
        self._initial_latency = latency or Latency()
        self.latency = Latency(**vars(self._initial_latency))
        self.capacity = capacity or Capacity()
        self._projects: dict[str, Project] = {}
        self._uids = itertools.count(7_000_000_000_000_000_001)
        self._ip_blocks = itertools.count(0)

    # -- plumbing --------------------------------------------------------------------------
    def _emit(self, kind: str, reason: str, node: Node) -> None:
        body = node.to_json()
        if node.tpu_env:  # what its VMs' tpu-env adds (the host simulator's metadata server serves it)
            body["_tpuEnv"] = dict(node.tpu_env)
        self._emit_event(NodeEvent(kind, reason, node.project, node.zone, node.node_id, body))

    def _proj(self, project: str) -> Project:
        return self._projects.setdefault(project, Project())

    def _new_op(self, project: str, zone: str, verb: str, target: str) -> Operation:
        now = self.clock.now()
        op_id = operation_id(now)
        op = Operation(project, zone, op_id, verb, target, now)
        self._proj(project).ops[(zone, op_id)] = op
        return op

    # -- the state machines ----------------------------------------------------------------
    def _used(self, zone: str, pool: Pool) -> int:
        return sum(
            n.accel.chips
            for p in self._projects.values()
            for n in p.nodes.values()
            if n.zone == zone and n.pool == pool
        )

    def _free_pool(self, zone: str, kind: Tier, reservation: str, chips: int) -> Pool | None:
        pools = self._free_pools(zone, kind, reservation, [chips])
        return pools[0] if pools else None

    def _free_pools(self, zone: str, kind: Tier, reservation: str, sizes: list[int]) -> list[Pool] | None:
        """A pool for each of ``sizes`` chips, all at once (one request's nodes), or None."""
        cap, taken, out = self.capacity.zone(zone), dict[Pool, int](), []
        for chips in sizes:
            for pool in self.capacity.candidates(zone, kind, reservation):
                if cap.size(pool) - self._used(zone, pool) - taken.get(pool, 0) >= chips:
                    taken[pool] = taken.get(pool, 0) + chips
                    out.append(pool)
                    break
            else:
                return None
        return out

    def _advance(self) -> None:
        now = self.clock.now()
        for _ in range(4):  # zero latency settles a create -> ready -> active chain in one call
            changed = False
            for project in self._projects.values():
                changed |= self._advance_nodes(project, now)
                changed |= self._advance_qrs(project, now)
                self._advance_ops(project, now)
            if not changed:
                break

    def _advance_nodes(self, p: Project, now: float) -> bool:
        changed = False
        for key, node in list(p.nodes.items()):
            if node.state == NodeState.CREATING and node.ready_at <= now:
                node.state = NodeState.READY
                self._emit("ready", "created", node)
                changed = True
            elif node.state == NodeState.DELETING and node.gone_at <= now:
                del p.nodes[key]
                changed = True
        return changed

    def _advance_qrs(self, p: Project, now: float) -> bool:
        changed = False
        for key, qr in sorted(p.qrs.items(), key=lambda kv: kv[1].create_time):
            nodes = [p.nodes.get((qr.zone, n.rsplit("/", 1)[1])) for n in qr.node_names]
            if qr.state == QrState.DELETING and not any(nodes):
                del p.qrs[key]
                changed = True
            elif qr.state == QrState.PROVISIONING and all(n and n.state == NodeState.READY for n in nodes):
                qr.state = QrState.ACTIVE
                changed = True
            elif qr.state == QrState.ACTIVE and qr.repair_at is not None and now >= qr.repair_at:
                changed |= self._repair(p, qr, now)
            elif qr.state == QrState.WAITING:
                if qr.valid_until is not None and now >= qr.valid_until:
                    qr.state, qr.initiator = QrState.FAILED, "SERVICE"
                    qr.error = exc.ResourceExhausted(
                        f"no {qr.kind} capacity for {qr.name} in {qr.zone} before queueingPolicy expired"
                    ).to_status()
                    changed = True
                elif now >= qr.valid_after and self._allocate(p, qr, now):
                    changed = True
        return changed

    def _allocate(self, p: Project, qr: QueuedResource, now: float, only: set[str] | None = None) -> bool:
        """Every node the request asks for (or the ``only`` ones, a repair) at once, or none."""
        todo = [x for x in qr.planned if only is None or x.node_id in only]
        accels = [self._accel(x.body) for x in todo]
        pools = self._free_pools(qr.zone, qr.kind, qr.reservation, [a.chips for a in accels])
        if pools is None:
            return False
        for x, accel, pool in zip(todo, accels, pools, strict=True):
            node = self._make_node(qr.project, qr.zone, x.node_id, x.body, accel, pool, now)
            if qr.kind == Tier.SPOT:
                node.spec["schedulingConfig"] = {**node.spec.get("schedulingConfig", {}), "spot": True}
            node.queued_resource = qr.name
            p.nodes[(qr.zone, node.node_id)] = node
            if node.name not in qr.node_names:
                qr.node_names.append(node.name)
        if qr.multislice:
            nodes = [p.nodes.get((qr.zone, x.node_id)) for x in qr.planned]
            coordinator = nodes[0].ips[0] if nodes[0] is not None else ""  # slice 0, worker 0
            for x, n in zip(qr.planned, nodes, strict=True):
                if n is not None:
                    n.tpu_env = megascale_env(x.slice_index, x.slices, coordinator)
        if only is None:
            qr.state, qr.initiator = QrState.PROVISIONING, "SERVICE"
        return True

    def _start_delete(self, node: Node, reason: str) -> None:
        if node.state == NodeState.DELETING:
            return
        was_running = node.state != NodeState.PREEMPTED
        node.state = NodeState.DELETING
        node.gone_at = self.clock.now() + self.latency.delete_s
        if was_running:
            self._emit("stopped", reason, node)

    def _repair(self, p: Project, qr: QueuedResource, now: float) -> bool:
        """Google's multislice repair: the preempted nodes go, come back by name when capacity allows,
        then every other node's VMs restart (their start-up scripts run again)."""
        nodes = {x.node_id: p.nodes.get((qr.zone, x.node_id)) for x in qr.planned}
        changed = False
        for n in nodes.values():
            if n is not None and n.state == NodeState.PREEMPTED:
                self._start_delete(n, "repair")
                qr.repairing.add(n.node_id)
                changed = True
        missing = {nid for nid, n in nodes.items() if n is None}
        if missing and self._allocate(p, qr, now, only=missing):
            return True
        if not missing and all(n is not None and n.state == NodeState.READY for n in nodes.values()):
            for nid, n in nodes.items():
                if n is not None and nid not in qr.repairing:
                    self._emit("stopped", "restart", n)
                    self._emit("ready", "restarted", n)
            qr.repairing.clear()
            qr.repair_at = None
            return True
        return changed

    def _advance_ops(self, p: Project, now: float) -> None:
        for op in p.ops.values():
            if op.done:
                continue
            collection, rid = op.target.split("/")[-2:]
            zone = op.zone
            if collection == "nodes":
                node = p.nodes.get((zone, rid))
                if node is None:
                    if op.verb == "delete":
                        op.finish(now, response={"@type": EMPTY_TYPE})
                    else:
                        op.finish(now, error=exc.ApiError(f"node {rid} was deleted while creating").to_status())
                elif op.verb == "create" and node.state == NodeState.READY:
                    op.finish(now, response={"@type": NODE_TYPE, **node.to_json()})
                elif op.verb == "create" and node.state != NodeState.CREATING:
                    op.finish(now, error=exc.ApiError(f"node {rid} is {node.state}").to_status())
            elif op.verb == "delete" and (zone, rid) not in p.qrs:
                op.finish(now, response={"@type": EMPTY_TYPE})

    # -- helpers for input ----------------------------------------------------------------
    def _accel(self, node_body: dict[str, Any]) -> AcceleratorType:
        name = node_body.get("acceleratorType")
        if name:
            try:
                return lookup(str(name))
            except KeyError as e:
                raise exc.InvalidArgument(str(e.args[0])) from None
        cfg = node_body.get("acceleratorConfig") or {}
        ctype = cfg.get("type")
        ctype = _CONFIG_TYPE_INTS.get(ctype, ctype) if isinstance(ctype, int) else ctype
        gen = _GEN_BY_CONFIG_TYPE.get(str(ctype))
        for row in ACCELERATOR_TYPES.values():
            if row.generation == gen and row.topology == cfg.get("topology"):
                return row
        raise exc.InvalidArgument("node needs acceleratorType or a known acceleratorConfig {type, topology}")

    def _make_node(
        self,
        project: str,
        zone: str,
        node_id: str,
        body: dict[str, Any],
        accel: AcceleratorType,
        pool: Pool,
        now: float,
    ) -> Node:
        block = next(self._ip_blocks)
        # Endpoints are loopback addresses (127.x.y.z): realistic per-host IPs that can never
        # reach a real network if something does connect to them.
        ips = [f"127.{10 + block // 250}.{block % 250}.{h + 2}" for h in range(accel.hosts)]
        spec = {
            k: body[k] for k in NODE_INPUT_FIELDS if k in body and k not in ("acceleratorType", "acceleratorConfig")
        }
        node = Node(project, zone, node_id, spec, accel, pool, next(self._uids), ips, now)
        node.ready_at = now + self.latency.provision_s
        return node

    def _check_node_body(self, node_id: str, body: dict[str, Any]) -> AcceleratorType:
        if not node_id or not ID_RE.match(node_id):
            raise exc.InvalidArgument(f"invalid node id {node_id!r}: lowercase letters, digits, hyphens")
        accel = self._accel(body)
        if not body.get("runtimeVersion"):
            raise exc.InvalidArgument("node.runtimeVersion is required")
        return accel
