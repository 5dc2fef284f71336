"""What the fake reads but never changes through the API: reservations (configured through
``/_fake/capacity``), regions with their TPU quotas, zones, projects and TPU machine types."""

from __future__ import annotations

import re
from typing import Any, Unpack

from infra.local.compute import exceptions as cexc
from infra.local.compute.base import API, Paging
from infra.local.compute.machines import MACHINE_TYPES
from infra.local.compute.placement import PlacementMixin
from infra.local.compute.records import region_of


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
            "id": str(abs(hash((zone, name))) % 10**18),
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
            return self._list("compute#reservationList", items, **page)

        return self._call("GET", API + _reservations(project, zone), run)

    def get_region(self, project: str, region: str) -> dict[str, Any]:
        path = f"projects/{project}/regions/{region}"

        def run() -> dict[str, Any]:
            if not re.match(r"^[a-z]+-[a-z]+\d+$", region):
                raise cexc.not_found(path)
            quotas = []
            for gen in sorted({m.quota_metric for m in MACHINE_TYPES.values()}):
                for metric in (gen, "PREEMPTIBLE_" + gen):
                    quotas.append({"metric": metric, "limit": float(self.capacity.quota(region, metric)),
                                   "usage": float(self._quota_usage(region, metric))})  # fmt: skip
            zones = sorted(
                {*(f"{region}-{s}" for s in "abc"), *(z for z in self.capacity.zones if region_of(z) == region)}
            )
            return {
                "kind": "compute#region",
                "id": str(abs(hash(region)) % 10**12),
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
            if not re.match(r"^[a-z]+-[a-z]+\d+-[a-z]$", zone):
                raise cexc.not_found(path)
            return {"kind": "compute#zone", "id": str(abs(hash(zone)) % 10**12), "name": zone, "status": "UP",
                    "region": f"{self.link_base}projects/{project}/regions/{region_of(zone)}",
                    "selfLink": self.link_base + path}  # fmt: skip

        return self._call("GET", API + path, run)

    def get_project(self, project: str) -> dict[str, Any]:
        """What a health check reads to know the Compute Engine API answers for the project."""

        def run() -> dict[str, Any]:
            return {"kind": "compute#project", "id": str(abs(hash(project)) % 10**12), "name": project,
                    "selfLink": f"{self.link_base}projects/{project}",
                    "defaultServiceAccount": "123456789012-compute@developer.gserviceaccount.com"}  # fmt: skip

        return self._call("GET", f"{API}projects/{project}", run)

    def get_machine_type(self, project: str, zone: str, name: str) -> dict[str, Any]:
        path = f"projects/{project}/zones/{zone}/machineTypes/{name}"

        def run() -> dict[str, Any]:
            m = MACHINE_TYPES.get(name)
            if m is None:
                raise cexc.not_found(path)
            return {"kind": "compute#machineType", "id": str(abs(hash(name)) % 10**12), "name": name,
                    "description": f"{m.chips} {m.generation} TPU chips, {m.cpus} vCPUs", "guestCpus": m.cpus,
                    "memoryMb": m.memory_mb, "zone": zone, "selfLink": self.link_base + path}  # fmt: skip

        return self._call("GET", API + path, run)
