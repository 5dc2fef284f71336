"""The Cloud TPU v2 adapter: queued resources and nodes as typed records.

The only module that touches ``google.cloud.tpu_v2``. Every call goes through the REST client built
by :func:`tpu_ops.cloud.clients.tpu_client`, translates SDK errors in one place, and retries reads
and deletes by the one retry policy. Creates are *not* retried here: the provisioning ladder checks
whether the resource already exists before it tries again.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

from tpu_ops.cloud import retry
from tpu_ops.cloud.translate import google_errors, translate_google
from tpu_ops.errors import NotFoundError, TpuOpsError, TransientError
from tpu_ops.settings import Settings
from tpu_ops.tiers import Tier

SERVICE: Final = "tpu"
T = TypeVar("T")


class NodeState:
    """Node states grouped by what the caller does about them."""

    READY: Final = frozenset({"READY"})
    PENDING: Final = frozenset({"CREATING", "STARTING", "RESTARTING", "REIMAGING", "REPAIRING", "UNHIDING"})
    # A preempted spot node cannot be restarted; TERMINATED and STOPPED behave the same for us.
    DEAD: Final = frozenset({"PREEMPTED", "TERMINATED", "STOPPED", "STOPPING", "UNKNOWN"})
    GOING: Final = frozenset({"DELETING", "HIDING", "HIDDEN"})


class QrState:
    """Queued-resource states grouped by what the caller does about them."""

    # ACCEPTED is the older name of WAITING_FOR_RESOURCES: accept both.
    WAITING: Final = frozenset({"CREATING", "ACCEPTED", "WAITING_FOR_RESOURCES", "PROVISIONING", "STATE_UNSPECIFIED"})
    ACTIVE: Final = frozenset({"ACTIVE"})
    FAILED: Final = frozenset({"FAILED"})
    # A SUSPENDED queued resource is never allocated again, yet holds its name and quota.
    SUSPENDED: Final = frozenset({"SUSPENDING", "SUSPENDED"})
    DELETING: Final = frozenset({"DELETING"})
    DEAD: Final = FAILED | SUSPENDED


@dataclass(frozen=True)
class NodeRecord:
    """A TPU VM node (one slice), as tpu-ops sees it."""

    node_id: str
    zone: str
    state: str
    accelerator_type: str
    labels: Mapping[str, str]
    endpoints: tuple[str, ...]
    create_time: float | None
    queued_resource: str = ""
    spot: bool = False

    @property
    def hosts(self) -> int:
        return len(self.endpoints)


@dataclass(frozen=True)
class QueuedResourceRecord:
    """A queued resource request and the node it asks for."""

    qr_id: str
    zone: str
    state: str
    tier: Tier
    node_id: str
    labels: Mapping[str, str]
    create_time: float | None
    reservation: str = ""
    accelerator_type: str = ""
    detail: str = ""
    node_count: int = 1  # above 1: a multislice request, nodes ``{node_id}-0`` .. (Google's multisliceParams)

    @property
    def node_ids(self) -> tuple[str, ...]:
        """The ids of the nodes it asks for, in slice order."""
        if self.node_count > 1:
            return tuple(f"{self.node_id}-{i}" for i in range(self.node_count))
        return (self.node_id,)


@dataclass(frozen=True)
class QueuedResourceRequest:
    """What to ask for: one node of ``accelerator_type`` on ``tier``."""

    qr_id: str
    node_id: str
    accelerator_type: str
    runtime_version: str
    tier: Tier
    valid_until_s: int
    labels: Mapping[str, str] = field(default_factory=dict)
    reservation: str = ""  # full path ``projects/P/locations/Z/reservations/N`` for the reservation tier
    network: str | None = None
    service_account: str | None = None
    metadata: Mapping[str, str] = field(default_factory=dict)
    node_count: int = 1  # above 1: one multislice request of that many nodes, ``{node_id}-0`` ..


@dataclass(frozen=True)
class PendingCreate:
    """A sent create, for :meth:`TpuApi.operation_error`; the SDK operation inside stays opaque."""

    zone: str
    tier: Tier
    operation: Any = field(repr=False, compare=False)


def _ts(value: Any) -> float | None:
    """A protobuf/proto-plus timestamp as epoch seconds (None when unset)."""
    if value is None:
        return None
    if hasattr(value, "timestamp"):
        t = float(value.timestamp())
        return t if t > 0 else None
    seconds = getattr(value, "seconds", 0)
    return float(seconds) + getattr(value, "nanos", 0) / 1e9 if seconds else None


def _enum_name(value: Any) -> str:
    return str(getattr(value, "name", value))


def zone_of(name: str, default: str = "") -> str:
    """The zone in ``projects/P/locations/ZONE/...`` (lists over ``locations/-`` need it)."""
    parts = name.split("/")
    return parts[3] if len(parts) > 3 and parts[2] == "locations" else default


def node_record(node: Any, zone: str) -> NodeRecord:
    """Build a record from a ``tpu_v2.Node``."""
    zone = zone_of(node.name, zone)
    sched = node.scheduling_config
    return NodeRecord(
        node_id=node.name.rsplit("/", 1)[-1],
        zone=zone,
        state=_enum_name(node.state),
        accelerator_type=node.accelerator_type,
        labels=dict(node.labels),
        endpoints=tuple(ep.ip_address for ep in node.network_endpoints),
        create_time=_ts(node.create_time),
        queued_resource=node.queued_resource.rsplit("/", 1)[-1] if node.queued_resource else "",
        spot=bool(sched.spot or sched.preemptible),
    )


def qr_record(qr: Any, zone: str) -> QueuedResourceRecord:
    """Build a record from a ``tpu_v2.QueuedResource``."""
    zone = zone_of(qr.name, zone)
    specs = list(qr.tpu.node_spec)
    node = specs[0].node if specs else None
    if qr.reservation_name:
        tier = Tier.RESERVATION
    elif "spot" in qr:
        tier = Tier.SPOT
    else:
        tier = Tier.ON_DEMAND
    ms = specs[0].multislice_params if specs else None
    count = int(ms.node_count) if ms is not None and ms.node_count > 1 else 1
    qr_id = qr.name.rsplit("/", 1)[-1]
    state = qr.state
    detail = ""
    if "failed_data" in state and state.failed_data.error.message:
        detail = state.failed_data.error.message
    return QueuedResourceRecord(
        qr_id=qr_id,
        zone=zone,
        state=_enum_name(state.state),
        tier=tier,
        # A multislice request's nodes are ``{prefix}-{i}``; the prefix defaults to the request's id.
        node_id=(ms.node_id_prefix or qr_id) if ms is not None and count > 1 else specs[0].node_id if specs else "",
        labels=dict(node.labels) if node is not None else {},
        create_time=_ts(qr.create_time),
        reservation=qr.reservation_name,
        accelerator_type=node.accelerator_type if node is not None else "",
        detail=detail,
        node_count=count,
    )


class TpuApi:
    """Queued resources and nodes in one project, through the real ``TpuClient`` (REST)."""

    def __init__(self, settings: Settings, client: Any = None) -> None:
        from tpu_ops.cloud.clients import tpu_client

        self.settings = settings
        self.project = settings.gcp_project
        self.client = client if client is not None else tpu_client(settings)
        # Bound a single HTTP call so a hung server cannot stall provisioning or teardown.
        self.call_timeout_s = 30.0

    # -- names -------------------------------------------------------------------------------
    def parent(self, zone: str) -> str:
        return f"projects/{self.project}/locations/{zone}"

    def qr_name(self, zone: str, qr_id: str) -> str:
        return f"{self.parent(zone)}/queuedResources/{qr_id}"

    def node_name(self, zone: str, node_id: str) -> str:
        return f"{self.parent(zone)}/nodes/{node_id}"

    def reservation_path(self, zone: str, name: str) -> str:
        """``projects/P/locations/Z/reservations/N``: the form the TPU API takes.

        A bare name is in this project and zone; a Compute-style ``projects/P/zones/Z/...`` path
        (what a spec may carry, e.g. a shared reservation of another project) is rewritten.
        """
        if not name.startswith("projects/"):
            return f"{self.parent(zone)}/reservations/{name}"
        parts = name.split("/")
        if len(parts) == 6 and parts[2] == "zones":
            parts[2] = "locations"
        return "/".join(parts)

    def _call(self, fn: Callable[[], T]) -> T:
        """One read/delete under the retry policy, with errors translated."""

        def once() -> T:
            with google_errors(SERVICE):
                return fn()

        return retry.call(self.settings, once)

    # -- reads -------------------------------------------------------------------------------
    def get_queued_resource(self, zone: str, qr_id: str) -> QueuedResourceRecord:
        name = self.qr_name(zone, qr_id)
        qr = self._call(lambda: self.client.get_queued_resource(name=name, timeout=self.call_timeout_s))
        return qr_record(qr, zone)

    def find_queued_resource(self, zone: str, qr_id: str) -> QueuedResourceRecord | None:
        try:
            return self.get_queued_resource(zone, qr_id)
        except NotFoundError:
            return None

    def list_queued_resources(self, zone: str = "-") -> list[QueuedResourceRecord]:
        """Queued resources in ``zone`` (``-``: every zone)."""
        parent = self.parent(zone)
        items = self._call(lambda: list(self.client.list_queued_resources(parent=parent, timeout=self.call_timeout_s)))
        return [qr_record(q, zone) for q in items]

    def get_node(self, zone: str, node_id: str) -> NodeRecord:
        name = self.node_name(zone, node_id)
        node = self._call(lambda: self.client.get_node(name=name, timeout=self.call_timeout_s))
        return node_record(node, zone)

    def find_node(self, zone: str, node_id: str) -> NodeRecord | None:
        try:
            return self.get_node(zone, node_id)
        except NotFoundError:
            return None

    def list_nodes(self, zone: str = "-") -> list[NodeRecord]:
        """Nodes in ``zone`` (``-``: every zone)."""
        parent = self.parent(zone)
        items = self._call(lambda: list(self.client.list_nodes(parent=parent, timeout=self.call_timeout_s)))
        return [node_record(n, zone) for n in items]

    # -- create (not retried here) -----------------------------------------------------------
    def build_queued_resource(self, zone: str, req: QueuedResourceRequest) -> Any:
        """The ``tpu_v2.QueuedResource`` message for ``req`` (tier, queueing policy, node spec)."""
        from google.cloud import tpu_v2
        from google.protobuf import duration_pb2

        node = tpu_v2.Node(
            accelerator_type=req.accelerator_type,
            runtime_version=req.runtime_version,
            labels=dict(req.labels),
            metadata=dict(req.metadata),
            scheduling_config=tpu_v2.SchedulingConfig(
                spot=req.tier == Tier.SPOT, reserved=req.tier == Tier.RESERVATION
            ),
        )
        if req.network:
            node.network_config = tpu_v2.NetworkConfig(network=req.network, enable_external_ips=False)
        if req.service_account:
            node.service_account = tpu_v2.ServiceAccount(email=req.service_account)
        spec = tpu_v2.QueuedResource.Tpu.NodeSpec(parent=self.parent(zone), node=node)
        if req.node_count > 1:  # one request for every slice: nodes ``{node_id}-0`` .. granted together
            params = tpu_v2.QueuedResource.Tpu.NodeSpec.MultisliceParams
            spec.multislice_params = params(node_count=req.node_count, node_id_prefix=req.node_id)
        else:
            spec.node_id = req.node_id
        qr = tpu_v2.QueuedResource(
            tpu=tpu_v2.QueuedResource.Tpu(node_spec=[spec]),
            queueing_policy=tpu_v2.QueuedResource.QueueingPolicy(
                valid_until_duration=duration_pb2.Duration(seconds=max(1, int(req.valid_until_s)))
            ),
        )
        if req.tier == Tier.SPOT:
            qr.spot = tpu_v2.QueuedResource.Spot()
        elif req.tier == Tier.RESERVATION:
            qr.reservation_name = self.reservation_path(zone, req.reservation)
        # On-demand is the API's default tier: no tier field at all.
        return qr

    def create_queued_resource(self, zone: str, req: QueuedResourceRequest, request_id: str) -> PendingCreate | None:
        """Send one create; the pending create to pass to :meth:`operation_error`. Raises translated errors.

        A 429 whose message mentions quota is a ``QuotaError`` (move on), any other 429/503 a
        ``TransientError`` (check for the resource, then try again).
        """
        msg = self.build_queued_resource(zone, req)
        with google_errors(SERVICE, zone=zone, tier=req.tier):
            op = self.client.create_queued_resource(
                request={
                    "parent": self.parent(zone),
                    "queued_resource_id": req.qr_id,
                    "queued_resource": msg,
                    "request_id": request_id,
                },
                timeout=self.call_timeout_s,
            )
        return None if op is None else PendingCreate(zone, req.tier, op)

    @staticmethod
    def _create_error(exc: BaseException, zone: str, tier: Tier) -> TpuOpsError:
        return translate_google(exc, SERVICE, zone=zone, tier=tier)

    def operation_error(self, pending: PendingCreate) -> TpuOpsError | None:
        """Refresh a create operation; the translated error if it finished with one, else None.

        An operation error with code 8 (RESOURCE_EXHAUSTED) is a stockout for (zone, tier).
        """
        op = pending.operation
        try:
            with google_errors(SERVICE):
                if not op.done(retry=None):
                    return None
        except TransientError:
            return None
        exc = op.exception(timeout=0) if hasattr(op, "exception") else None
        if exc is None:
            return None
        return self._create_error(exc, pending.zone, pending.tier)

    # -- delete ------------------------------------------------------------------------------
    def delete_queued_resource(self, zone: str, qr_id: str, *, force: bool = True) -> bool:
        """Ask for deletion (force also deletes the node); False if it was already gone."""
        from google.cloud import tpu_v2

        req = tpu_v2.DeleteQueuedResourceRequest(name=self.qr_name(zone, qr_id), force=force)
        try:
            self._call(lambda: self.client.delete_queued_resource(request=req, timeout=self.call_timeout_s))
        except NotFoundError:
            return False
        return True

    def delete_node(self, zone: str, node_id: str) -> bool:
        """Ask for deletion of a node; False if it was already gone."""
        name = self.node_name(zone, node_id)
        try:
            self._call(lambda: self.client.delete_node(name=name, timeout=self.call_timeout_s))
        except NotFoundError:
            return False
        return True
