"""What the fake reads but never changes through the API: reservations (configured through
``/_fake/capacity``), regions with their TPU quotas, zones (``geography``), projects and TPU machine
types, each with its list and aggregated list where Compute Engine has them."""

from __future__ import annotations

import zlib
from typing import Any, Unpack

from infra.local.compute import exceptions as cexc
from infra.local.compute import geography
from infra.local.compute.base import API, Paging
from infra.local.compute.machines import MACHINE_TYPES, MachineType
from infra.local.compute.placement import PlacementMixin
from infra.local.compute.records import region_of, timestamp

# What Compute Engine shows as the creationTimestamp of its zones, regions and machine types.
BUILT_IN = "1969-12-31T16:00:00.000-08:00"


def _id(*parts: str) -> str:
    """A stable numeric id (``hash()`` changes between processes)."""
    return str(zlib.crc32("/".join(parts).encode()) * 1000 + 17)


def _reservations(project: str, zone: str, name: str = "") -> str:
    return f"projects/{project}/zones/{zone}/reservations" + (f"/{name}" if name else "")


class CatalogMixin(PlacementMixin):
    """``reservations.get/list``, ``regions.get``, ``zones.get``, ``projects.get``, ``machineTypes.get``."""

    def _reservation_json(self, project: str, zone: str, name: str) -> dict[str, Any]:
        res = self.capacity.zone(zone).reservations.get(name)
        path = _reservations(project, zone, name)
        if res is None:
            raise cexc.not_found(path)
        used = sum(1 for i in self._holding() if i.zone == zone and i.reservation == name)
        return {
            "kind": "compute#reservation",
            "id": _id(project, zone, name),
            "creationTimestamp": timestamp(self.created_at),
            "name": name,
            "zone": f"{self.link_base}projects/{project}/zones/{zone}",
            "selfLink": self.link_base + path,
            "status": "READY",
            "specificReservationRequired": True,
            "specificReservation": {
                "count": str(res.count),
                "inUseCount": str(used),
                "instanceProperties": {"machineType": res.machine_type},
            },
        }

    def get_reservation(self, project: str, zone: str, name: str) -> dict[str, Any]:
        return self._call(
            "GET", API + _reservations(project, zone, name), lambda: self._reservation_json(project, zone, name)
        )

    def list_reservations(self, project: str, zone: str, **page: Unpack[Paging]) -> dict[str, Any]:
        def run() -> dict[str, Any]:
            names = sorted(self.capacity.zone(zone).reservations)
            items = [self._reservation_json(project, zone, n) for n in names]
            return self._list("compute#reservationList", items, **page, path=_reservations(project, zone))

        return self._call("GET", API + _reservations(project, zone), run)

    def get_region(self, project: str, region: str) -> dict[str, Any]:
        path = f"projects/{project}/regions/{region}"

        def run() -> dict[str, Any]:
            quotas = []
            for gen in sorted({m.quota_metric for m in MACHINE_TYPES.values()}):
                for metric in (gen, "PREEMPTIBLE_" + gen):
                    quotas.append({"metric": metric, "limit": float(self.capacity.quota(region, metric)),
                                   "usage": float(self._quota_usage(region, metric))})  # fmt: skip
            zones = geography.zones_of(region, self.capacity.zones)
            return {
                "kind": "compute#region",
                "id": _id(region),
                "creationTimestamp": BUILT_IN,
                "name": region,
                "selfLink": self.link_base + path,
                "status": "UP",
                "zones": [f"{self.link_base}projects/{project}/zones/{z}" for z in zones],
                "quotas": quotas,
            }

        return self._call("GET", API + path, run)

    def get_zone(self, project: str, zone: str) -> dict[str, Any]:
        path = f"projects/{project}/zones/{zone}"

        def run() -> dict[str, Any]:
            return {"kind": "compute#zone", "id": _id(zone), "creationTimestamp": BUILT_IN, "name": zone,
                    "status": "UP",
                    "region": f"{self.link_base}projects/{project}/regions/{region_of(zone)}",
                    "selfLink": self.link_base + path}  # fmt: skip

        return self._call("GET", API + path, run)

    def get_project(self, project: str) -> dict[str, Any]:
        """What a health check reads to know the Compute Engine API answers for the project."""

        def run() -> dict[str, Any]:
            return {"kind": "compute#project", "id": _id(project), "creationTimestamp": timestamp(self.created_at),
                    "name": project,
                    "selfLink": f"{self.link_base}projects/{project}",
                    "defaultServiceAccount": "123456789012-compute@developer.gserviceaccount.com"}  # fmt: skip

        return self._call("GET", f"{API}projects/{project}", run)

    def _machine_type_json(self, project: str, zone: str, m: MachineType) -> dict[str, Any]:
        path = f"projects/{project}/zones/{zone}/machineTypes/{m.name}"
        return {"kind": "compute#machineType", "id": _id(m.name), "creationTimestamp": BUILT_IN, "name": m.name,
                "description": f"{m.chips} {m.generation} TPU chips, {m.cpus} vCPUs", "guestCpus": m.cpus,
                "memoryMb": m.memory_mb, "maximumPersistentDisks": 128, "maximumPersistentDisksSizeGb": "263168",
                "isSharedCpu": False, "zone": zone, "selfLink": self.link_base + path}  # fmt: skip

    def get_machine_type(self, project: str, zone: str, name: str) -> dict[str, Any]:
        path = f"projects/{project}/zones/{zone}/machineTypes/{name}"

        def run() -> dict[str, Any]:
            m = MACHINE_TYPES.get(name)
            if m is None:
                raise cexc.not_found(path)
            return self._machine_type_json(project, zone, m)

        return self._call("GET", API + path, run)

    def list_machine_types(self, project: str, zone: str, **page: Unpack[Paging]) -> dict[str, Any]:
        """The TPU machine types (the only ones this fake serves), in every zone that exists."""
        path = f"projects/{project}/zones/{zone}/machineTypes"

        def run() -> dict[str, Any]:
            items = [self._machine_type_json(project, zone, MACHINE_TYPES[n]) for n in sorted(MACHINE_TYPES)]
            return self._list("compute#machineTypeList", items, **page, path=path)

        return self._call("GET", API + path, run)

    def _scoped(self, project: str, collection: str) -> list[tuple[str, dict[str, Any]]] | None:
        if collection == "reservations":
            return [(f"zones/{z}", self._reservation_json(project, z, n))
                    for z, zc in self.capacity.zones.items() for n in zc.reservations]  # fmt: skip
        if collection == "machineTypes":
            return [(f"zones/{z}", self._machine_type_json(project, z, m))
                    for z in geography.zones(self.capacity.zones) for m in MACHINE_TYPES.values()]  # fmt: skip
        return super()._scoped(project, collection)
