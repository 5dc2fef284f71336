"""Regional managed instance groups (``regions/<r>/instanceGroupManagers``): insert, get, list,
listManagedInstances, delete. ``distributionPolicy`` names the zones (default: the region's) and the
``targetShape``; a BULK group accepts only ``ANY_SINGLE_ZONE`` (Google's "About bulk mode") and puts
all its VMs in the first of its zones that has room for all of them.

Simplification: whatever the shape, the fake keeps a regional group's VMs in one zone.
"""

from __future__ import annotations

from typing import Any, Unpack

from infra.local.compute import exceptions as cexc
from infra.local.compute import geography
from infra.local.compute.base import API, Paging, last
from infra.local.compute.groups import GroupsMixin
from infra.local.compute.records import REGION_GROUPS, Group
from infra.local.core import exceptions as exc

SHAPES = ("EVEN", "BALANCED", "ANY", "ANY_SINGLE_ZONE")


class RegionalGroupsMixin(GroupsMixin):
    """``regionInstanceGroupManagers.*`` (the group records and their life are ``groups``')."""

    def _distribution(self, project: str, region: str, body: dict[str, Any]) -> dict[str, Any]:
        """The group's ``distributionPolicy``, checked, with Compute Engine's defaults filled in."""
        policy = dict(body.get("distributionPolicy") or {})
        shape = policy.get("targetShape") or "EVEN"
        if shape not in SHAPES:
            raise cexc.Invalid(
                f"Invalid value for field 'resource.distributionPolicy.targetShape': {shape!r}; "
                f"allowed: {', '.join(SHAPES)}"
            )
        mode = (body.get("targetSizePolicy") or {}).get("mode")
        if mode == "BULK" and shape != "ANY_SINGLE_ZONE":
            raise cexc.Invalid(
                f"Invalid value for field 'resource.distributionPolicy.targetShape': '{shape}'. A regional "
                "managed instance group in bulk mode (targetSizePolicy.mode: BULK) supports only the "
                "ANY_SINGLE_ZONE target distribution shape."
            )
        known = geography.zones_of(region, self.capacity.zones)
        zones = [last(str((z or {}).get("zone") or "")) for z in policy.get("zones") or []] or known
        for z in zones:
            if z not in known:
                raise cexc.Invalid(
                    f"Invalid value for field 'resource.distributionPolicy.zones': '{z}'. "
                    f"Zone must be in region {region}."
                )
        links = [{"zone": f"{self.link_base}projects/{project}/zones/{z}"} for z in zones]
        return {**policy, "zones": links, "targetShape": shape}

    def insert_region_group(
        self, project: str, region: str, body: dict[str, Any], request_id: str | None = None
    ) -> dict[str, Any]:
        geography.check_path(f"{API}projects/{project}/regions/{region}", self.capacity.zones)
        dist = self._distribution(project, region, body)
        zones = [last(z["zone"]) for z in dist["zones"]]
        zone = self._fitting_zone(project, zones, body)
        return self.insert_group(project, zone, {**body, "distributionPolicy": dist}, request_id, region=region)

    def _fitting_zone(self, project: str, zones: list[str], body: dict[str, Any]) -> str:
        """The first zone the group's template can place a VM in (e.g. where its reservation is), else the
        first zone (whose error the insert then reports)."""
        with self._lock:
            try:
                _, _, treg, tname = self._resolve(body.get("instanceTemplate"), "resource.instanceTemplate")
                props = dict(self._templates[(project, treg, tname)].body.get("properties") or {})
            except (exc.ApiError, KeyError):
                return zones[0]
            for zone in zones:
                try:
                    self._placement(project, zone, props)
                    return zone
                except exc.ApiError:
                    continue
        return zones[0]

    def get_region_group(self, project: str, region: str, name: str) -> dict[str, Any]:
        return self._get_call(REGION_GROUPS, project, region, name)

    def list_region_groups(self, project: str, region: str, **page: Unpack[Paging]) -> dict[str, Any]:
        return self._list_call(REGION_GROUPS, project, region, page)

    def list_region_managed_instances(
        self, project: str, region: str, name: str, max_results: int | None = None, token: str | None = None
    ) -> dict[str, Any]:
        return self._list_managed(REGION_GROUPS, project, region, name, max_results, token)

    def delete_region_group(
        self, project: str, region: str, name: str, request_id: str | None = None
    ) -> dict[str, Any]:
        return self._delete_group(REGION_GROUPS, project, region, name, request_id)

    def _choose_zone(self, grp: Group, props: dict[str, Any], count: int) -> None:
        """A regional group without VMs goes to the first of its zones with room for ``count`` of them."""
        if not grp.region or self._members(grp):
            return
        zones = [last(z["zone"]) for z in grp.body["distributionPolicy"]["zones"]]
        for zone in zones:
            try:
                machine, model, reservation, _ = self._placement(grp.project, zone, props)
            except exc.ApiError:
                continue
            if self._shortfall(grp.project, zone, machine, model, reservation, count) is None:
                grp.zone = zone
                return
