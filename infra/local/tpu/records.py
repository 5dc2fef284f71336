"""Records of the fake TPU API and their JSON in the v2 REST shape (camelCase, enum names)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from infra.local.core.clock import rfc3339
from infra.local.tpu.capacity import Pool
from infra.local.tpu.multislice import Planned
from tpu_ops.accelerators import AcceleratorType
from tpu_ops.tiers import Tier

TYPE_PREFIX = "type.googleapis.com/"
META_TYPE = TYPE_PREFIX + "google.cloud.tpu.v2.OperationMetadata"
NODE_TYPE = TYPE_PREFIX + "google.cloud.tpu.v2.Node"
QR_TYPE = TYPE_PREFIX + "google.cloud.tpu.v2.QueuedResource"
EMPTY_TYPE = TYPE_PREFIX + "google.protobuf.Empty"

# AcceleratorConfig.Type by generation of the tpu_ops table.
ACCEL_CONFIG_TYPE = {"v2": "V2", "v3": "V3", "v4": "V4", "v5e": "V5LITE_POD", "v5p": "V5P", "v6e": "V6E"}
NODE_PORT = 8470
# Fields of a Node the caller sets (everything else is output only and ignored on input).
NODE_INPUT_FIELDS = (
    "description", "acceleratorType", "runtimeVersion", "networkConfig", "networkConfigs", "cidrBlock",
    "serviceAccount", "schedulingConfig", "dataDisks", "labels", "metadata", "tags",
    "shieldedInstanceConfig", "acceleratorConfig", "bootDiskConfig",
)  # fmt: skip


class NodeState:
    CREATING, READY, DELETING, PREEMPTED = "CREATING", "READY", "DELETING", "PREEMPTED"
    RUNNING = frozenset({READY})
    STOPPED = frozenset({PREEMPTED, DELETING})


class QrState:
    WAITING = "WAITING_FOR_RESOURCES"
    PROVISIONING, ACTIVE, FAILED = "PROVISIONING", "ACTIVE", "FAILED"
    DELETING, SUSPENDED = "DELETING", "SUSPENDED"
    HOLDS_NODES = frozenset({PROVISIONING, ACTIVE, SUSPENDED, DELETING})
    RESETTABLE = frozenset({ACTIVE, FAILED, SUSPENDED})


# QueuedResourceState has one (empty) ``<state>Data`` message per state, except WAITING_FOR_RESOURCES.
_STATE_DATA = {
    "CREATING": "creatingData", "ACCEPTED": "acceptedData", "PROVISIONING": "provisioningData",
    "FAILED": "failedData", "DELETING": "deletingData", "ACTIVE": "activeData",
    "SUSPENDING": "suspendingData", "SUSPENDED": "suspendedData",
}  # fmt: skip


def parent_of(project: str, zone: str) -> str:
    return f"projects/{project}/locations/{zone}"


@dataclass
class Node:
    project: str
    zone: str
    node_id: str
    spec: dict[str, Any]  # caller-set fields (NODE_INPUT_FIELDS only)
    accel: AcceleratorType
    pool: Pool
    uid: int
    ips: list[str]
    create_time: float
    state: str = NodeState.CREATING
    ready_at: float = 0.0
    gone_at: float = 0.0
    queued_resource: str = ""
    guest_attributes: dict[tuple[int, str, str], str] = field(default_factory=dict)
    tpu_env: dict[str, str] = field(default_factory=dict)  # MEGASCALE_* of a multislice node (its VMs' tpu-env)

    @property
    def name(self) -> str:
        return f"{parent_of(self.project, self.zone)}/nodes/{self.node_id}"

    @property
    def hosts(self) -> int:
        return len(self.ips)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name}
        out.update({k: v for k, v in self.spec.items() if v not in (None, {}, [])})
        out["acceleratorType"] = self.accel.name
        out["acceleratorConfig"] = {
            "type": ACCEL_CONFIG_TYPE.get(self.accel.generation, "TYPE_UNSPECIFIED"),
            "topology": self.accel.topology,
        }
        out.setdefault("networkConfig", {})
        out["networkConfig"] = {
            "network": f"projects/{self.project}/global/networks/default",
            "subnetwork": f"projects/{self.project}/regions/{self.zone.rsplit('-', 1)[0]}/subnetworks/default",
            **out["networkConfig"],
        }
        out.setdefault(
            "serviceAccount", {"email": "default", "scope": ["https://www.googleapis.com/auth/cloud-platform"]}
        )
        out["state"] = self.state
        if self.state == NodeState.READY:
            out["health"] = "HEALTHY"
        out["createTime"] = rfc3339(self.create_time)
        out["id"] = str(self.uid)
        out["networkEndpoints"] = [{"ipAddress": ip, "port": NODE_PORT} for ip in self.ips]
        out["apiVersion"] = "V2"
        if self.queued_resource:
            out["queuedResource"] = self.queued_resource
        if self.tpu_env:
            out["multisliceNode"] = True
        return out


@dataclass
class QueuedResource:
    project: str
    zone: str
    qr_id: str
    spec: dict[str, Any]  # tpu, spot/guaranteed/reservationName, queueingPolicy as sent
    kind: Tier  # which capacity pool it draws from
    reservation: str  # reservation short name, "-" for any, "" if not reserved
    create_time: float
    valid_after: float = 0.0
    valid_until: float | None = None
    request_id: str = ""
    create_op: str = ""
    state: str = QrState.WAITING
    initiator: str = "USER"
    error: dict[str, Any] | None = None
    node_names: list[str] = field(default_factory=list)
    planned: list[Planned] = field(default_factory=list)  # the nodes it asks for (multislice: nodeCount of them)
    repair_at: float | None = None  # a multislice node was preempted: Google starts its repair then
    repairing: set[str] = field(default_factory=set)  # node ids being replaced by the repair

    @property
    def name(self) -> str:
        return f"{parent_of(self.project, self.zone)}/queuedResources/{self.qr_id}"

    @property
    def multislice(self) -> bool:
        return any(p.slices > 1 for p in self.planned)

    def node_specs(self) -> list[dict[str, Any]]:
        return list(self.spec.get("tpu", {}).get("nodeSpec", []))

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "createTime": rfc3339(self.create_time)}
        out.update(self.spec)
        st: dict[str, Any] = {"state": self.state, "stateInitiator": self.initiator}
        data_key = _STATE_DATA.get(self.state)
        if data_key:
            st[data_key] = {"error": self.error} if self.state == QrState.FAILED and self.error else {}
        out["state"] = st
        return out


@dataclass
class Operation:
    project: str
    zone: str
    op_id: str
    verb: str  # create / delete / reset
    target: str
    create_time: float
    done: bool = False
    end_time: float = 0.0
    error: dict[str, Any] | None = None
    response: dict[str, Any] | None = None  # already carries "@type"

    @property
    def name(self) -> str:
        return f"{parent_of(self.project, self.zone)}/operations/{self.op_id}"

    def finish(
        self, now: float, *, response: dict[str, Any] | None = None, error: dict[str, Any] | None = None
    ) -> None:
        self.done, self.end_time, self.response, self.error = True, now, response, error

    def to_json(self) -> dict[str, Any]:
        # Only these five keys: the client parses Operation strictly.
        meta: dict[str, Any] = {
            "@type": META_TYPE,
            "createTime": rfc3339(self.create_time),
            "target": self.target,
            "verb": self.verb,
            "apiVersion": "v2",
        }
        if self.done:
            meta["endTime"] = rfc3339(self.end_time)
        out: dict[str, Any] = {"name": self.name, "metadata": meta, "done": self.done}
        if self.done and self.error is not None:
            out["error"] = self.error
        elif self.done and self.response is not None:
            out["response"] = self.response
        return out
