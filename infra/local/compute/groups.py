"""Managed instance groups: insert, get, list, listManagedInstances, delete; a group creates its VMs
from its template (all together under ``targetSizePolicy.mode: BULK``, which Google allows only over
a RESERVATION_BOUND or FLEX_START template; else one by one as capacity allows, so a group can come
up partly) and, with
``defaultActionOnFailure: REPAIR``, replaces the TERMINATED ones. Until a VM exists its managed
instance is listed (named, ``currentAction: CREATING``), as Compute Engine lists it. Zonal here;
regional groups (``regional_groups``) are the same records and mechanics."""

from __future__ import annotations

import re
import secrets
from typing import Any, Unpack

from infra.local.compute import exceptions as cexc
from infra.local.compute.base import API, Paging
from infra.local.compute.instances import InstancesMixin
from infra.local.compute.records import (
    GROUPS,
    OUTPUT_ONLY,
    REGION_GROUPS,
    Group,
    Instance,
    Status,
    region_of,
    timestamp,
)
from infra.local.core import exceptions as exc
from infra.local.core.backend import page

BULK_MODELS = ("RESERVATION_BOUND", "FLEX_START")


class GroupsMixin(InstancesMixin):
    """``instanceGroupManagers.*`` of zones."""

    def _resolve(self, link: Any, field: str) -> tuple[str, str, str, str]:
        """(project, scope kind, scope name, name) of a template or policy link/partial path."""
        m = re.search(r"projects/([^/]+)/(global|regions/([^/]+))/(instanceTemplates|resourcePolicies)/([^/]+)$",
                      str(link or ""))  # fmt: skip
        if not m:
            raise cexc.Invalid(f"Invalid value for field '{field}': {link!r}")
        return m.group(1), m.group(4), m.group(3) or "", m.group(5)

    def insert_group(
        self, project: str, zone: str, body: dict[str, Any], request_id: str | None = None, region: str = ""
    ) -> dict[str, Any]:
        """A zonal group in ``zone``; with ``region``, a regional group (``zone``: one of its zones, the
        one its template and policy are checked in)."""

        def build(name: str) -> Group:
            _, kind, treg, tname = self._resolve(body.get("instanceTemplate"), "resource.instanceTemplate")
            if kind != "instanceTemplates" or (project, treg, tname) not in self._templates:
                raise cexc.Invalid(
                    f"Invalid value for field 'resource.instanceTemplate': {body.get('instanceTemplate')!r}. "
                    "The template does not exist."
                )
            tpl = self._templates[(project, treg, tname)]
            props = dict(tpl.body.get("properties") or {})
            try:
                machine, model = self._placement(project, zone, props)[:2]
            except exc.NotFound:  # its reservation does not exist yet (a calendar window to come): it waits
                machine = self._machine(props.get("machineType"), "resource.instanceTemplate")
                model = str((props.get("scheduling") or {}).get("provisioningModel") or "STANDARD")
            size = body.get("targetSize")
            if not isinstance(size, int) or size < 0:
                raise cexc.Invalid(f"Invalid value for field 'resource.targetSize': {size!r}")
            mode = (body.get("targetSizePolicy") or {}).get("mode")
            if mode not in (None, "BULK", "INDIVIDUAL"):
                raise cexc.Invalid(
                    f"Invalid value for field 'resource.targetSizePolicy.mode': {mode!r}; allowed: BULK, INDIVIDUAL"
                )
            if mode == "BULK" and model not in BULK_MODELS:
                # "Create a MIG that uses the bulk mode": bulk mode "is only supported with instance
                # templates that specify either a reservation-bound or flex-start provisioning model".
                raise cexc.Invalid(
                    "Invalid value for field 'resource.targetSizePolicy.mode': 'BULK'. Bulk mode is only supported "
                    "with instance templates that specify either a reservation-bound or flex-start provisioning "
                    f"model; instance template '{tpl.path}' specifies provisioningModel {model}."
                )
            action = (body.get("instanceLifecyclePolicy") or {}).get("defaultActionOnFailure")
            if action not in (None, "REPAIR", "DO_NOTHING"):
                raise cexc.Invalid(
                    "Invalid value for field 'resource.instanceLifecyclePolicy.defaultActionOnFailure': "
                    f"{action!r}; allowed: REPAIR, DO_NOTHING"
                )
            policy = None
            wp_link = (body.get("resourcePolicies") or {}).get("workloadPolicy")
            if wp_link and "/" not in str(wp_link):  # a bare name (what gcloud sends): the group's region's
                wp_link = f"projects/{project}/regions/{region_of(zone)}/resourcePolicies/{wp_link}"
            if wp_link:
                _, pkind, preg, pname = self._resolve(wp_link, "resource.resourcePolicies.workloadPolicy")
                if (
                    pkind != "resourcePolicies"
                    or preg != region_of(zone)
                    or (project, preg, pname) not in self._policies
                ):
                    raise cexc.Invalid(
                        f"Invalid value for field 'resource.resourcePolicies.workloadPolicy': {wp_link!r}. The "
                        f"policy does not exist in region {region_of(zone)}."
                    )
                policy = self._policies[(project, preg, pname)]
                topo = (policy.body.get("workloadPolicy") or {}).get("acceleratorTopology")
                if topo:
                    chips = 1
                    for d in str(topo).split("x"):
                        chips *= int(d)
                    if size and chips != size * machine.chips:  # 0: grown by resize requests
                        raise cexc.Invalid(
                            f"Invalid value for field 'resource.targetSize': {size}. acceleratorTopology {topo} "
                            f"needs {chips // machine.chips} VMs of {machine.name} ({chips} chips)."
                        )
            kept = {k: v for k, v in body.items() if k not in OUTPUT_ONLY}
            kept.setdefault("baseInstanceName", name)
            # BULK: the insert ends before any VM exists; the group creates them as capacity allows.
            return Group(project, zone, name, next(self._uids), kept, tpl, policy, self.clock.now(), region=region)

        if region:
            return self._insert_now(REGION_GROUPS, project, region, body, request_id, build)
        return self._insert_now(GROUPS, project, zone, body, request_id, build)

    def _awaiting(self, grp: Group) -> int:
        """Target-size VMs the group's resize requests will create, not the group (see ``resize``)."""
        return 0

    def _action(self, inst: Instance) -> str:
        if inst.deleting:
            return "DELETING"
        if inst.status in (Status.PENDING, Status.PROVISIONING, Status.STAGING):
            return "CREATING"
        return "NONE"

    def _group_json(self, grp: Group) -> dict[str, Any]:
        base = self.link_base
        members = self._members(grp)
        actions = dict.fromkeys(
            ("none", "creating", "creatingWithoutRetries", "deleting", "recreating", "abandoning", "refreshing",
             "restarting", "resuming", "starting", "stopping", "suspending", "verifying"), 0)  # fmt: skip
        for inst in members:
            actions[self._action(inst).lower()] += 1
        waiting = not grp.deleting and len(members) < grp.target_size
        if waiting:
            actions["creating"] += grp.target_size - len(members)
        stable = not waiting and actions["none"] == len(members)
        out: dict[str, Any] = {"kind": "compute#instanceGroupManager", "id": str(grp.uid)}
        out.update(grp.body)
        out.update({
            "name": grp.name,
            grp.scope.split("/")[0][:-1]: f"{base}projects/{grp.project}/{grp.scope}",
            "selfLink": base + grp.path,
            "creationTimestamp": timestamp(grp.create_time),
            "instanceTemplate": base + grp.template.path,
            "versions": [{"instanceTemplate": base + grp.template.path, "targetSize": {"calculated": grp.target_size}}],
            "instanceGroup": f"{base}projects/{grp.project}/{grp.scope}/instanceGroups/{grp.name}",
            "currentActions": actions,
            "fingerprint": "ZmFrZS1pZ20=",
        })  # fmt: skip
        if grp.policy is not None:
            out["resourcePolicies"] = {"workloadPolicy": base + grp.policy.path}
        status: dict[str, Any] = {"isStable": stable, "versionTarget": {"isReached": True},
                                  "stateful": {"hasStatefulConfig": False}}  # fmt: skip
        if grp.bulk:
            check: dict[str, Any] = {}
            if grp.bulk_check is not None:
                check["timestamp"] = timestamp(grp.bulk_check)
            if waiting and grp.bulk_error is not None:
                check["error"] = grp.bulk_error
            status["bulkInstanceOperation"] = {"inProgress": waiting, "lastProgressCheck": check}
        topo = (grp.policy.body.get("workloadPolicy") or {}).get("acceleratorTopology") if grp.policy else None
        if topo:
            running = sum(1 for i in members if i.status == Status.RUNNING)
            state = (
                "ACTIVE" if running == grp.target_size
                else "ACTIVATING" if waiting or actions["creating"]
                else "INCOMPLETE"
            )  # fmt: skip
            status["appliedAcceleratorTopologies"] = [{"acceleratorTopology": topo, "state": state}]
        out["status"] = status
        return out

    def _render(self, rec: Any) -> dict[str, Any]:
        return self._group_json(rec) if isinstance(rec, Group) else super()._render(rec)

    def get_group(self, project: str, zone: str, name: str) -> dict[str, Any]:
        return self._get_call(GROUPS, project, zone, name)

    def list_groups(self, project: str, zone: str, **page: Unpack[Paging]) -> dict[str, Any]:
        return self._list_call(GROUPS, project, zone, page)

    def list_managed_instances(
        self, project: str, zone: str, name: str, max_results: int | None = None, token: str | None = None
    ) -> dict[str, Any]:
        return self._list_managed(GROUPS, project, zone, name, max_results, token)

    def _list_managed(
        self, kind: Any, project: str, where: str, name: str, max_results: int | None, token: str | None
    ) -> dict[str, Any]:
        """The managed instances of a group: its VMs, then those not created yet (CREATING, no ``id`` or
        ``instanceStatus``; ``lastAttempt`` says why while a BULK group waits)."""

        def run() -> dict[str, Any]:
            grp = self._get(kind, project, where, name)
            version = {"instanceTemplate": self.link_base + grp.template.path}
            items = []
            for inst in self._members(grp):
                mi: dict[str, Any] = {
                    "instance": self.link_base + inst.path,
                    "name": inst.name,
                    "id": str(inst.uid),
                    "instanceStatus": inst.status,
                    "currentAction": self._action(inst),
                    "targetStatus": "RUNNING",
                    "version": version,
                }
                if inst.status == Status.PENDING:
                    del mi["id"]
                items.append(mi)
            for pending in self._to_create(grp):
                mi = {"instance": f"{self.link_base}projects/{project}/zones/{grp.zone}/instances/{pending}",
                      "name": pending, "currentAction": "CREATING", "targetStatus": "RUNNING",
                      "version": version}  # fmt: skip
                if grp.bulk_error is not None:
                    mi["lastAttempt"] = {"errors": grp.bulk_error}
                items.append(mi)
            chunk, nxt = page(items, max_results, token)
            out: dict[str, Any] = {"managedInstances": chunk} if chunk else {}
            if nxt:
                out["nextPageToken"] = nxt
            return out

        return self._call("POST", API + kind.path(project, where, name) + "/listManagedInstances", run)

    def _to_create(self, grp: Group) -> list[str]:
        """Names of the managed instances the group has yet to create (stable until created)."""
        missing = 0 if grp.deleting else max(grp.target_size - len(self._members(grp)), 0)
        base = grp.body.get("baseInstanceName") or grp.name
        taken = {n for (p, _, n) in self._instances if p == grp.project} | set(grp.pending)
        while len(grp.pending) < missing:
            name = f"{base}-{secrets.token_hex(2)}"
            if name not in taken:
                grp.pending.append(name)
                taken.add(name)
        del grp.pending[missing:]
        return list(grp.pending)

    def delete_group(self, project: str, zone: str, name: str, request_id: str | None = None) -> dict[str, Any]:
        return self._delete_group(GROUPS, project, zone, name, request_id)

    def _delete_group(self, kind: Any, project: str, where: str, name: str, request_id: str | None) -> dict[str, Any]:
        def run(grp: Group) -> dict[str, Any]:
            op = self._new_op(project, grp.scope, "delete", grp.path, grp.uid)
            grp.deleting = True
            for inst in self._members(grp):
                if not inst.deleting:
                    self._start_delete(inst, "deleted")
            return op.to_json(self.link_base)

        return self._delete_call(kind, project, where, name, request_id, run)

    # -- time ------------------------------------------------------------------------------------
    def _choose_zone(self, grp: Group, props: dict[str, Any], count: int) -> None:
        """Where a group's next VMs go: a zonal group's zone (a regional one chooses; ``regional_groups``)."""

    def _grow(self, grp: Group, now: float) -> bool:
        """Create the group's missing VMs: all at once under BULK (or none), else as many as fit."""
        missing = grp.target_size - len(self._members(grp)) - self._awaiting(grp)
        if grp.deleting or missing <= 0:
            return False
        props = dict(grp.template.body.get("properties") or {})
        props.pop("name", None)
        grp.bulk_check = now
        self._choose_zone(grp, props, missing if grp.bulk else 1)
        try:
            machine, model, reservation, _ = self._placement(grp.project, grp.zone, props)
        except exc.ApiError as e:  # e.g. its reservation was removed since: the group keeps trying
            grp.bulk_error = {"errors": [{"code": e.reason or e.status, "message": e.message}]}
            return False
        count = missing if grp.bulk else 1
        err = self._shortfall(grp.project, grp.zone, machine, model, reservation, count)
        if err is not None:
            grp.bulk_error = err
            return False
        grp.bulk_error = None
        names = self._to_create(grp)
        for name in names[:count]:
            grp.pending.remove(name)
            md = dict(props.get("metadata") or {})
            # As Compute Engine does: a member names its group (how a reaper gets from a VM to its group).
            md["items"] = [*(md.get("items") or []), {"key": "created-by", "value": grp.path},
                           {"key": "instance-template", "value": grp.template.path}]  # fmt: skip
            body = {**props, "name": name, "metadata": md}
            inst = self._new_instance(grp.project, grp.zone, body, group=grp.name)
            inst.group_where = grp.where
            inst.status, inst.ready_at = Status.PROVISIONING, now + self.latency.provision_s
            self._instances[(inst.project, inst.zone, inst.name)] = inst
            grp.instances.append(inst.name)
        return True

    def _advance_group(self, grp: Group, now: float) -> bool:
        if grp.deleting:
            if not self._members(grp):
                del self._groups[grp.key]
                return True
            return False
        changed = False
        members = self._members(grp)
        if len(members) < len(grp.instances):
            grp.instances = [i.name for i in members]  # deleted members (DELETE action) are recreated below
            changed = True
        if grp.on_failure == "REPAIR":
            for inst in members:
                if inst.status == Status.TERMINATED:
                    del self._instances[(inst.project, inst.zone, inst.name)]
                    grp.instances.remove(inst.name)
                    changed = True
        return self._grow(grp, now) or changed
