"""Records of the fake Compute Engine and their JSON in the v1 REST shape (camelCase, enum names), and
the collections they live in (``Kind``: where a record is kept and how its paths read)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Generic, Protocol, TypeVar

from infra.local.compute.machines import MachineType


def timestamp(t: float) -> str:
    """Compute Engine's RFC 3339 form with an offset: ``2026-11-23T19:20:00.123-00:00``."""
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "-00:00"


def region_of(zone: str) -> str:
    return zone.rsplit("-", 1)[0]


Key = tuple[str, str, str]  # (project, where, name); where = zone, region ("" = global) or scope


class Record(Protocol):
    uid: int

    @property
    def path(self) -> str: ...


R = TypeVar("R", bound=Record)


@dataclass(frozen=True)
class Kind(Generic[R]):
    """A collection: its URL name, the backend attribute holding its records, where they live."""

    collection: str  # "instances", "instanceTemplates", ...
    attr: str  # the backend's dict of records by Key
    where: str  # "zone", "region" (a region, or "" for global) or "scope" (zones/<z>|regions/<r>|global)
    kind: str  # "compute#instance" (its lists: "compute#instanceList", "compute#instanceAggregatedList")
    aggregated: bool = True  # served by ``aggregated/<collection>``

    def scope(self, where: str) -> str:
        if self.where == "zone":
            return f"zones/{where}"
        if self.where == "scope":
            return where
        return f"regions/{where}" if where else "global"

    def path(self, project: str, where: str, name: str = "") -> str:
        """``projects/<p>/<scope>/<collection>[/<name>]``: resource paths, links and (after API) REST paths."""
        base = f"projects/{project}/{self.scope(where)}/{self.collection}"
        return f"{base}/{name}" if name else base


class Status:
    """Instance statuses (Compute Engine's ``Instance.status``)."""

    PENDING, PROVISIONING, STAGING, RUNNING = "PENDING", "PROVISIONING", "STAGING", "RUNNING"
    STOPPING, TERMINATED = "STOPPING", "TERMINATED"
    HOLDS_CAPACITY = frozenset({PROVISIONING, STAGING, RUNNING, STOPPING})


# Output-only fields a caller may send back (e.g. a get -> modify -> insert) that the fake recomputes.
OUTPUT_ONLY = frozenset({
    "kind", "id", "selfLink", "creationTimestamp", "status", "statusMessage", "lastStartTimestamp",
    "lastStopTimestamp", "zone", "region", "fingerprint",
})  # fmt: skip


@dataclass
class Instance:
    project: str
    zone: str
    name: str
    uid: int
    body: dict[str, Any]  # what the caller sent (output-only fields dropped)
    machine: MachineType
    model: str  # provisioningModel
    reservation: str  # the reservation it consumes, or ""
    ip: str
    create_time: float
    status: str = Status.PROVISIONING
    ready_at: float = 0.0  # PROVISIONING -> RUNNING
    gone_at: float | None = None  # STOPPING (delete) -> gone
    kill_at: float | None = None  # STOPPING (preempted) -> TERMINATED or gone
    run_until: float | None = None  # maxRunDuration
    wait_until: float | None = None  # FLEX_START PENDING: requestValidForDuration
    start_time: float | None = None
    stop_time: float | None = None
    status_message: str = ""
    group: str = ""  # the managing instance group's name
    group_where: str = ""  # its zone, or its region for a regional group ("" = this instance's zone)
    deleting: bool = False
    preempted: bool = False

    @property
    def path(self) -> str:
        return INSTANCES.path(self.project, self.zone, self.name)

    @property
    def hostname(self) -> str:
        return f"{self.name}.{self.zone}.c.{self.project}.internal"

    def metadata(self) -> dict[str, str]:
        items = (self.body.get("metadata") or {}).get("items") or []
        return {str(i["key"]): str(i.get("value", "")) for i in items if "key" in i}

    def termination_action(self) -> str:
        return str((self.body.get("scheduling") or {}).get("instanceTerminationAction") or "STOP")

    def to_json(self, base: str) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": "compute#instance", "id": str(self.uid), "name": self.name}
        out.update({k: v for k, v in self.body.items() if k not in ("name", "machineType")})
        out["machineType"] = f"{base}projects/{self.project}/zones/{self.zone}/machineTypes/{self.machine.name}"
        out["zone"] = f"{base}projects/{self.project}/zones/{self.zone}"
        out["selfLink"] = base + self.path
        out["creationTimestamp"] = timestamp(self.create_time)
        out["status"] = self.status
        if self.status_message:
            out["statusMessage"] = self.status_message
        if self.start_time is not None:
            out["lastStartTimestamp"] = timestamp(self.start_time)
        if self.stop_time is not None:
            out["lastStopTimestamp"] = timestamp(self.stop_time)
        sched = dict(self.body.get("scheduling") or {})
        sched.setdefault("provisioningModel", self.model)
        sched.setdefault("onHostMaintenance", "TERMINATE")
        sched.setdefault("automaticRestart", False)
        if self.model == "SPOT":
            sched.setdefault("instanceTerminationAction", "STOP")
        out["scheduling"] = sched
        md = self.body.get("metadata") or {}
        out["metadata"] = {"kind": "compute#metadata", "fingerprint": "ZmFrZS1tZA==", **md}
        out["labels"] = dict(self.body.get("labels") or {})
        out["labelFingerprint"] = "ZmFrZS1sYWJlbHM="
        nic = dict((self.body.get("networkInterfaces") or [{}])[0])
        nic.setdefault("network", f"{base}projects/{self.project}/global/networks/default")
        nic.update({"name": "nic0", "networkIP": self.ip, "kind": "compute#networkInterface"})
        out["networkInterfaces"] = [nic]
        out["hostname"] = self.hostname
        out["cpuPlatform"] = "Unknown CPU Platform"
        return out


@dataclass
class Regional:
    """A resource kept as its caller sent it, in a region (a template's "" = global)."""

    project: str
    region: str
    name: str
    uid: int
    body: dict[str, Any]
    create_time: float


class Template(Regional):
    @property
    def path(self) -> str:
        return TEMPLATES.path(self.project, self.region, self.name)

    def to_json(self, base: str) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": "compute#instanceTemplate", "id": str(self.uid)}
        out.update({k: v for k, v in self.body.items() if k not in OUTPUT_ONLY})
        out["name"] = self.name
        out["selfLink"] = base + self.path
        out["creationTimestamp"] = timestamp(self.create_time)
        if self.region:
            out["region"] = f"{base}projects/{self.project}/regions/{self.region}"
        return out


class Policy(Regional):
    @property
    def path(self) -> str:
        return POLICIES.path(self.project, self.region, self.name)

    def to_json(self, base: str) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": "compute#resourcePolicy", "id": str(self.uid)}
        out.update({k: v for k, v in self.body.items() if k not in OUTPUT_ONLY})
        out.update({"name": self.name, "selfLink": base + self.path, "status": "READY"})
        out["region"] = f"{base}projects/{self.project}/regions/{self.region}"
        out["creationTimestamp"] = timestamp(self.create_time)
        return out


@dataclass
class Group:
    """A managed instance group: zonal, or regional (``region`` set; its VMs in ``zone``, the one zone its
    ``distributionPolicy`` allows or, for ``ANY_SINGLE_ZONE``, the zone chosen when they are created)."""

    project: str
    zone: str
    name: str
    uid: int
    body: dict[str, Any]
    template: Template
    policy: Policy | None
    create_time: float
    instances: list[str] = field(default_factory=list)  # instance names, in creation order
    bulk_error: dict[str, Any] | None = None
    bulk_check: float | None = None
    deleting: bool = False
    region: str = ""
    pending: list[str] = field(default_factory=list)  # names of the managed instances not created yet

    @property
    def where(self) -> str:
        return self.region or self.zone

    @property
    def key(self) -> Key:
        return (self.project, self.where, self.name)

    @property
    def scope(self) -> str:
        return f"regions/{self.region}" if self.region else f"zones/{self.zone}"

    @property
    def path(self) -> str:
        return (REGION_GROUPS if self.region else GROUPS).path(self.project, self.where, self.name)

    @property
    def target_size(self) -> int:
        return int(self.body.get("targetSize") or 0)

    @property
    def bulk(self) -> bool:
        return (self.body.get("targetSizePolicy") or {}).get("mode") == "BULK"

    @property
    def on_failure(self) -> str:
        return str((self.body.get("instanceLifecyclePolicy") or {}).get("defaultActionOnFailure") or "REPAIR")


@dataclass
class Operation:
    project: str
    scope: str  # "zones/<z>", "regions/<r>" or "global"
    name: str
    uid: int
    op_type: str
    target: str  # resource path (projects/...)
    target_id: int
    insert_time: float
    status: str = "RUNNING"
    end_time: float | None = None
    error: dict[str, Any] | None = None  # {"errors": [...]}
    http_error: tuple[int, str] | None = None
    status_message: str = ""
    # As Google's: RUNNING when answered, DONE later. Reads of it that still answer RUNNING, and the
    # asynchronous failure (error body, HTTP status and message) it ends with, if it fails.
    polls_left: int = 0
    fail_with: tuple[dict[str, Any], tuple[int, str]] | None = None

    @property
    def path(self) -> str:
        return OPERATIONS.path(self.project, self.scope, self.name)

    @property
    def done(self) -> bool:
        return self.status == "DONE"

    def finish(self, now: float, error: dict[str, Any] | None = None, http: tuple[int, str] | None = None) -> None:
        if not self.done:
            self.status, self.end_time, self.error, self.http_error = "DONE", now, error, http

    def to_json(self, base: str) -> dict[str, Any]:
        out: dict[str, Any] = {
            "kind": "compute#operation",
            "id": str(self.uid),
            "name": self.name,
            "operationType": self.op_type,
            "targetLink": base + self.target,
            "targetId": str(self.target_id),
            "status": self.status,
            "user": "tpu-ops-local@fake.iam.gserviceaccount.com",
            "progress": 100 if self.done else 0,
            "insertTime": timestamp(self.insert_time),
            "startTime": timestamp(self.insert_time),
            "selfLink": base + self.path,
        }
        kind, _, where = self.scope.partition("/")
        if kind == "zones":
            out["zone"] = f"{base}projects/{self.project}/zones/{where}"
        elif kind == "regions":
            out["region"] = f"{base}projects/{self.project}/regions/{where}"
        if self.end_time is not None:
            out["endTime"] = timestamp(self.end_time)
        if self.status_message:
            out["statusMessage"] = self.status_message
        if self.error is not None:
            out["error"] = self.error
        if self.http_error is not None:
            out["httpErrorStatusCode"], out["httpErrorMessage"] = self.http_error
        return out


# The collections, each once: its records' ``path`` and every REST path and 404/409 of it follow from these.
INSTANCES: Kind[Instance] = Kind("instances", "_instances", "zone", "compute#instance")
TEMPLATES: Kind[Template] = Kind("instanceTemplates", "_templates", "region", "compute#instanceTemplate")
POLICIES: Kind[Policy] = Kind("resourcePolicies", "_policies", "region", "compute#resourcePolicy")
GROUPS: Kind[Group] = Kind("instanceGroupManagers", "_groups", "zone", "compute#instanceGroupManager")
# Regional groups share the table: a region's name never equals a zone's, so keys cannot collide.
REGION_GROUPS: Kind[Group] = Kind("instanceGroupManagers", "_groups", "region", "compute#instanceGroupManager",
                                  aggregated=False)  # fmt: skip
OPERATIONS: Kind[Operation] = Kind("operations", "_ops", "scope", "compute#operation")
