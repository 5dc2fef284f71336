"""Typed records of the Compute Engine adapter (:mod:`tpu_ops.cloud.compute`): no SDK import here."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final


class InstanceStatus:
    """Compute Engine instance states grouped by what the caller does about them."""

    RUNNING: Final = frozenset({"RUNNING"})
    # PENDING: a flex-start VM waiting for capacity.
    PENDING: Final = frozenset({"PENDING", "PROVISIONING", "STAGING"})
    # A spot TPU VM cannot be restarted; a stopped, repaired or terminated host loses the slice.
    LOST: Final = frozenset({"STOPPING", "STOPPED", "SUSPENDING", "SUSPENDED", "TERMINATED", "REPAIRING",
                             "PENDING_STOP", "DEPROVISIONING"})  # fmt: skip


PREEMPTED_OP: Final = "compute.instances.preempted"


@dataclass(frozen=True)
class OpRef:
    """A pending write: which operations collection holds it (zone, region or global) and its name."""

    scope: str  # "zone" | "region" | "global"
    location: str
    name: str
    zone: str = ""
    tier: str = ""


@dataclass(frozen=True)
class InstanceRecord:
    name: str
    zone: str
    status: str
    labels: Mapping[str, str]
    machine_type: str
    internal_ip: str
    hostname: str
    created_at: float | None
    provisioning_model: str
    worker_id: int | None
    status_message: str = ""
    id: str = ""  # the instance's numeric id: a recreated instance of the same name has a new one


@dataclass(frozen=True)
class ManagedInstanceRecord:
    name: str
    status: str  # instance status, "" while the VM does not exist yet
    action: str  # currentAction: CREATING, NONE, RECREATING, DELETING, ...
    errors: tuple[str, ...] = ()  # lastAttempt errors (code: message)


@dataclass(frozen=True)
class GroupRecord:
    name: str
    zone: str
    target_size: int
    template: str
    description: str
    created_at: float | None
    stable: bool
    bulk_errors: tuple[str, ...] = ()  # status.bulkInstanceOperation.lastProgressCheck errors
    creating: int = 0  # currentActions.creating: hosts the group has still to create


@dataclass(frozen=True)
class TemplateRecord:
    name: str
    description: str
    labels: Mapping[str, str]
    created_at: float | None


@dataclass(frozen=True)
class PolicyRecord:
    name: str
    region: str
    description: str
    created_at: float | None


@dataclass(frozen=True)
class VmSpec:
    """What every host of a slice is: machine type, image, tier, labels, metadata."""

    machine_type: str
    image_family: str
    image_project: str
    provisioning_model: str  # STANDARD | SPOT | FLEX_START | RESERVATION_BOUND
    labels: Mapping[str, str] = field(default_factory=dict)
    metadata: Mapping[str, str] = field(default_factory=dict)
    reservation: str = ""  # name or projects/P/reservations/N for RESERVATION_BOUND
    max_run_duration_s: int | None = None
    request_valid_for_s: int | None = None  # flex-start: how long to wait for capacity
    network: str | None = None
    service_account: str | None = None
    description: str = ""
    boot_disk_gb: int = 100


def vm_body(spec: VmSpec, zone: str | None) -> dict[str, Any]:
    """Instance (``zone`` given) or template-properties fields for ``spec``: one shape for both."""
    mt = spec.machine_type if zone is None else f"zones/{zone}/machineTypes/{spec.machine_type}"
    sched: dict[str, Any] = {"provisioning_model": spec.provisioning_model, "on_host_maintenance": "TERMINATE",
                             "automatic_restart": False}  # fmt: skip
    if spec.provisioning_model == "SPOT":
        sched["instance_termination_action"] = "STOP"  # a stopped host is what loss detection sees
    if spec.provisioning_model == "FLEX_START" or spec.max_run_duration_s:
        sched["instance_termination_action"] = "DELETE"
        sched["max_run_duration"] = {"seconds": int(spec.max_run_duration_s or 7 * 86400)}
    body: dict[str, Any] = {
        "machine_type": mt,
        "labels": dict(spec.labels),
        "metadata": {"items": [{"key": k, "value": v} for k, v in spec.metadata.items()]},
        "scheduling": sched,
        "disks": [{
            "boot": True, "auto_delete": True,
            "initialize_params": {
                "source_image": f"projects/{spec.image_project}/global/images/family/{spec.image_family}",
                "disk_size_gb": spec.boot_disk_gb,
            },
        }],
        "network_interfaces": [{"network": spec.network or "global/networks/default"}],
    }  # fmt: skip
    if spec.provisioning_model == "RESERVATION_BOUND":
        body["reservation_affinity"] = {
            "consume_reservation_type": "SPECIFIC_RESERVATION",
            "key": "compute.googleapis.com/reservation-name",
            "values": [spec.reservation],
        }
    if spec.service_account:
        body["service_accounts"] = [{"email": spec.service_account,
                                     "scopes": ["https://www.googleapis.com/auth/cloud-platform"]}]  # fmt: skip
    if spec.description:
        body["description"] = spec.description
    return body
