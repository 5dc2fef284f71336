"""Where a VM may go: machine type and scheduling of an instance body, and whether the zone's
capacity (per provisioning model, or a reservation's count) and the region's quota have room."""

from __future__ import annotations

from typing import Any

from infra.local.compute import exceptions as cexc
from infra.local.compute.base import ComputeBase, last, seconds
from infra.local.compute.capacity import MODELS
from infra.local.compute.machines import MACHINE_TYPES, MachineType
from infra.local.compute.records import Instance, Status, region_of

PROVISIONING_MODELS = (*MODELS, "RESERVATION_BOUND")
RESERVATION_KEY = "compute.googleapis.com/reservation-name"


class PlacementMixin(ComputeBase):
    """Validation of where a VM goes, and the capacity and quota it would use."""

    def _machine(self, value: Any, field: str) -> MachineType:
        name = last(str(value or ""))
        if name not in MACHINE_TYPES:
            raise cexc.Invalid(
                f"Invalid value for field '{field}': {value!r}. Machine type {name!r} is not a TPU machine type "
                f"this fake serves ({', '.join(sorted(MACHINE_TYPES))})",
            )
        return MACHINE_TYPES[name]

    def _placement(self, project: str, zone: str, body: dict[str, Any]) -> tuple[MachineType, str, str, float | None]:
        """(machine type, provisioning model, reservation, maxRunDuration s) of a valid instance body."""
        machine = self._machine(body.get("machineType"), "resource.machineType")
        sched = body.get("scheduling") or {}
        model = str(sched.get("provisioningModel") or ("SPOT" if sched.get("preemptible") else "STANDARD"))
        if model not in PROVISIONING_MODELS:
            raise cexc.Invalid(
                f"Invalid value for field 'resource.scheduling.provisioningModel': {model!r}; "
                f"allowed: {', '.join(PROVISIONING_MODELS)}"
            )
        action = sched.get("instanceTerminationAction")
        if action not in (None, "STOP", "DELETE"):
            raise cexc.Invalid(
                f"Invalid value for field 'resource.scheduling.instanceTerminationAction': {action!r}; "
                "allowed: STOP, DELETE"
            )
        if sched.get("onHostMaintenance") not in (None, "TERMINATE"):
            raise cexc.Invalid(
                "Invalid value for field 'resource.scheduling.onHostMaintenance': TPU VMs must use TERMINATE"
            )
        run_s = seconds(sched["maxRunDuration"], "resource.scheduling.maxRunDuration") if sched.get(
            "maxRunDuration") else None  # fmt: skip
        if model == "FLEX_START" and run_s is None:
            raise cexc.Invalid(
                "Invalid value for field 'resource.scheduling.maxRunDuration': FLEX_START needs a maxRunDuration"
            )
        reservation = ""
        affinity = body.get("reservationAffinity") or {}
        if model == "RESERVATION_BOUND":
            values = affinity.get("values") or []
            if affinity.get("consumeReservationType") != "SPECIFIC_RESERVATION" or affinity.get(
                "key") != RESERVATION_KEY or len(values) != 1:  # fmt: skip
                raise cexc.Invalid(
                    "Invalid value for field 'resource.reservationAffinity': RESERVATION_BOUND needs "
                    f"{{consumeReservationType: SPECIFIC_RESERVATION, key: {RESERVATION_KEY}, values: [<name>]}}"
                )
            reservation = last(str(values[0]))
            res = self.capacity.zone(zone).reservations.get(reservation)
            if res is None:
                raise cexc.not_found(f"projects/{project}/zones/{zone}/reservations/{reservation}")
            if res.machine_type != machine.name:
                raise cexc.Invalid(f"Reservation {reservation} is for {res.machine_type}, not {machine.name}")
        return machine, model, reservation, run_s

    # -- capacity --------------------------------------------------------------------------------
    def _holding(self) -> list[Instance]:
        return [i for i in self._instances.values() if i.status in Status.HOLDS_CAPACITY]

    def _shortfall(
        self, project: str, zone: str, machine: MachineType, model: str, reservation: str, count: int
    ) -> dict[str, Any] | None:
        """The operation error if ``count`` VMs cannot be placed now, else None."""
        zc = self.capacity.zone(zone)
        if model == "RESERVATION_BOUND":
            res = zc.reservations.get(reservation)
            used = sum(1 for i in self._holding() if i.zone == zone and i.reservation == reservation)
            ok = res is not None and res.count - used >= count
        else:
            used = sum(i.machine.chips for i in self._holding() if i.zone == zone and i.model == model)
            ok = zc.chips[model] - used >= machine.chips * count
        if not ok:
            return cexc.zone_exhausted(project, zone, machine.name, model)
        region = region_of(zone)
        metric = ("PREEMPTIBLE_" if model == "SPOT" else "") + machine.quota_metric
        limit = self.capacity.quota(region, metric)
        usage = self._quota_usage(region, metric)
        if usage + machine.chips * count > limit:
            return cexc.quota_exceeded(metric, limit, region)
        return None

    def _quota_usage(self, region: str, metric: str) -> int:
        return sum(
            i.machine.chips
            for i in self._holding()
            if region_of(i.zone) == region
            and ("PREEMPTIBLE_" if i.model == "SPOT" else "") + i.machine.quota_metric == metric
        )
