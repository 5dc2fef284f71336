"""Managed instance groups (zonal): insert, get, list, listManagedInstances, delete; a group
creates its VMs from its template (all together under ``targetSizePolicy.mode: BULK``, which Google
allows only over a RESERVATION_BOUND or FLEX_START template; else one by one as capacity allows, so
a group can come up partly) and, with
``defaultActionOnFailure: REPAIR``, replaces the TERMINATED ones."""

from __future__ import annotations

import re
import secrets
from typing import Any, Unpack

from infra.local.compute import exceptions as cexc
from infra.local.compute.base import API, Paging
from infra.local.compute.instances import InstancesMixin
from infra.local.compute.records import GROUPS, OUTPUT_ONLY, Group, Instance, Status, region_of, timestamp
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
        self, project: str, zone: str, body: dict[str, Any], request_id: str | None = None
    ) -> dict[str, Any]:
        def build(name: str) -> Group:
            _, kind, treg, tname = self._resolve(body.get("instanceTemplate"), "resource.instanceTemplate")
            if kind != "instanceTemplates" or (project, treg, tname) not in self._templates:
                raise cexc.Invalid(
                    f"Invalid value for field 'resource.instanceTemplate': {body.get('instanceTemplate')!r}. "
                    "The template does not exist."
                )
            tpl = self._templates[(project, treg, tname)]
            machine = self._placement(project, zone, dict(tpl.body.get("properties") or {}))[0]
            size = body.get("targetSize")
            if not isinstance(size, int) or size < 0:
                raise cexc.Invalid(f"Invalid value for field 'resource.targetSize': {size!r}")
            mode = (body.get("targetSizePolicy") or {}).get("mode")
            if mode not in (None, "BULK", "INDIVIDUAL"):
                raise cexc.Invalid(
                    f"Invalid value for field 'resource.targetSizePolicy.mode': {mode!r}; allowed: BULK, INDIVIDUAL"
                )
            model = self._placement(project, zone, dict(tpl.body.get("properties") or {}))[1]
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
                    if chips != size * machine.chips:
                        raise cexc.Invalid(
                            f"Invalid value for field 'resource.targetSize': {size}. acceleratorTopology {topo} "
                            f"needs {chips // machine.chips} VMs of {machine.name} ({chips} chips)."
                        )
            kept = {k: v for k, v in body.items() if k not in OUTPUT_ONLY}
            kept.setdefault("baseInstanceName", name)
            # BULK: the insert ends before any VM exists; the group creates them as capacity allows.
            return Group(project, zone, name, next(self._uids), kept, tpl, policy, self.clock.now())

        return self._insert_now(GROUPS, project, zone, body, request_id, build)

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
            "zone": f"{base}projects/{grp.project}/zones/{grp.zone}",
            "selfLink": base + grp.path,
            "creationTimestamp": timestamp(grp.create_time),
            "instanceTemplate": base + grp.template.path,
            "instanceGroup": f"{base}projects/{grp.project}/zones/{grp.zone}/instanceGroups/{grp.name}",
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
        def run() -> dict[str, Any]:
            grp = self._get(GROUPS, project, zone, name)
            items = []
            for inst in self._members(grp):
                mi: dict[str, Any] = {
                    "instance": self.link_base + inst.path,
                    "name": inst.name,
                    "id": str(inst.uid),
                    "instanceStatus": inst.status,
                    "currentAction": self._action(inst),
                    "targetStatus": "RUNNING",
                }
                if inst.status == Status.PENDING:
                    del mi["id"]
                items.append(mi)
            if not grp.bulk and not grp.deleting:
                # A group that is not BULK lists the VMs it could not create yet: CREATING, no status,
                # and the last attempt's error (a stock-out for the hosts capacity did not cover).
                for pending in grp.pending[: max(0, grp.target_size - len(items))]:
                    mi = {"instance": f"{self.link_base}projects/{project}/zones/{zone}/instances/{pending}",
                          "name": pending, "currentAction": "CREATING", "targetStatus": "RUNNING"}  # fmt: skip
                    if grp.bulk_error is not None:
                        mi["lastAttempt"] = {"errors": grp.bulk_error}
                    items.append(mi)
            chunk, nxt = page(items, max_results, token)
            out: dict[str, Any] = {"managedInstances": chunk} if chunk else {}
            if nxt:
                out["nextPageToken"] = nxt
            return out

        return self._call("POST", API + GROUPS.path(project, zone, name) + "/listManagedInstances", run)

    def delete_group(self, project: str, zone: str, name: str, request_id: str | None = None) -> dict[str, Any]:
        def run(grp: Group) -> dict[str, Any]:
            op = self._new_op(project, f"zones/{zone}", "delete", grp.path, grp.uid)
            grp.deleting = True
            for inst in self._members(grp):
                if not inst.deleting:
                    self._start_delete(inst, "deleted")
            return op.to_json(self.link_base)

        return self._delete_call(GROUPS, project, zone, name, request_id, run)

    # -- time ------------------------------------------------------------------------------------
    def _grow(self, grp: Group, now: float) -> bool:
        """Create the group's missing VMs: all at once under BULK (or none), else as many as fit."""
        missing = grp.target_size - len(self._members(grp))
        if grp.deleting or missing <= 0:
            return False
        props = dict(grp.template.body.get("properties") or {})
        props.pop("name", None)
        if not grp.bulk:
            self._pending_names(grp, missing)  # named while CREATING, as Google's group names them
        grp.bulk_check = now
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
        for _ in range(count):
            name = self._pending_names(grp, missing).pop(0)
            md = dict(props.get("metadata") or {})
            # As Compute Engine does: a member names its group (how a reaper gets from a VM to its group).
            md["items"] = [*(md.get("items") or []), {"key": "created-by", "value": grp.path},
                           {"key": "instance-template", "value": grp.template.path}]  # fmt: skip
            body = {**props, "name": name, "metadata": md}
            inst = self._new_instance(grp.project, grp.zone, body, group=grp.name)
            inst.status, inst.ready_at = Status.PROVISIONING, now + self.latency.provision_s
            self._instances[(inst.project, inst.zone, inst.name)] = inst
            grp.instances.append(inst.name)
        return True

    def _pending_names(self, grp: Group, missing: int) -> list[str]:
        """The names the group gives the VMs it still has to create (each becomes that VM's name)."""
        base = grp.body.get("baseInstanceName") or grp.name
        del grp.pending[missing:]
        while len(grp.pending) < missing:
            name = f"{base}-{secrets.token_hex(2)}"
            if (grp.project, grp.zone, name) not in self._instances and name not in grp.pending:
                grp.pending.append(name)
        return grp.pending

    def _advance_group(self, grp: Group, now: float) -> bool:
        if grp.deleting:
            if not self._members(grp):
                del self._groups[(grp.project, grp.zone, grp.name)]
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
