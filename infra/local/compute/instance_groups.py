"""Instance groups (zonal and regional), read-only: every managed instance group has the instance
group of the same name that holds its VMs (``instanceGroupManager.instanceGroup`` links to it).
gcloud lists them to describe a group and to list its instances."""

from __future__ import annotations

from typing import Any, Unpack

from infra.local.compute import exceptions as cexc
from infra.local.compute.base import API, ComputeBase, Paging
from infra.local.compute.records import Group, timestamp


class InstanceGroupsMixin(ComputeBase):
    """``instanceGroups.get/list`` and ``regionInstanceGroups.get/list`` (``scope``: ``zones/<z>`` or
    ``regions/<r>``)."""

    def _instance_group_json(self, grp: Group) -> dict[str, Any]:
        base = self.link_base
        out = {
            "kind": "compute#instanceGroup",
            "id": str(grp.uid + 1),
            "creationTimestamp": timestamp(grp.create_time),
            "name": grp.name,
            "description": f"This instance group is controlled by Instance Group Manager '{grp.name}'. To modify "
            "instances in this group, use the Instance Group Manager API: "
            "https://cloud.google.com/compute/docs/reference/latest/instanceGroupManagers",
            grp.scope.split("/")[0][:-1]: f"{base}projects/{grp.project}/{grp.scope}",
            "fingerprint": "42WmSpB8rSM=",
            "size": len(self._members(grp)),
            "selfLink": f"{base}projects/{grp.project}/{grp.scope}/instanceGroups/{grp.name}",
        }
        network = (((grp.template.body.get("properties") or {}).get("networkInterfaces") or [{}])[0]).get("network")
        out["network"] = network or f"{base}projects/{grp.project}/global/networks/default"
        return out

    def _groups_in(self, project: str, scope: str) -> list[Group]:
        return sorted((g for g in self._groups.values() if g.project == project and g.scope == scope),
                      key=lambda g: g.name)  # fmt: skip

    def list_instance_groups(self, project: str, scope: str, **page: Unpack[Paging]) -> dict[str, Any]:
        path = f"projects/{project}/{scope}/instanceGroups"

        def run() -> dict[str, Any]:
            items = [self._instance_group_json(g) for g in self._groups_in(project, scope)]
            return self._list("compute#instanceGroupList", items, **page, path=path)

        return self._call("GET", API + path, run)

    def get_instance_group(self, project: str, scope: str, name: str) -> dict[str, Any]:
        path = f"projects/{project}/{scope}/instanceGroups/{name}"

        def run() -> dict[str, Any]:
            for g in self._groups_in(project, scope):
                if g.name == name:
                    return self._instance_group_json(g)
            raise cexc.not_found(path)

        return self._call("GET", API + path, run)
