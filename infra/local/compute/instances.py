"""Instances: insert (placed now, waiting as FLEX_START, or failed for want of capacity), get,
list, delete, and their time-driven life (PROVISIONING -> RUNNING; STOPPING -> gone or TERMINATED)."""

from __future__ import annotations

from typing import Any, Unpack

from infra.local.compute import exceptions as cexc
from infra.local.compute.base import Paging, seconds
from infra.local.compute.hosts import HostsMixin
from infra.local.compute.placement import PlacementMixin
from infra.local.compute.records import INSTANCES, OUTPUT_ONLY, Instance, Operation, Status


class InstancesMixin(HostsMixin, PlacementMixin):
    """``instances.*`` of zones."""

    def _new_instance(self, project: str, zone: str, body: dict[str, Any], group: str = "") -> Instance:
        """Validate an instance body and build the record (not stored)."""
        name = self._new_name(INSTANCES, project, zone, body)
        machine, model, reservation, run_s = self._placement(project, zone, body)
        kept = {k: v for k, v in body.items() if k not in OUTPUT_ONLY}
        block = next(self._ips)
        # Loopback addresses (127.x.y.z): realistic per-host IPs that can never reach a real network.
        ip = f"127.{20 + block // 250 // 250}.{block // 250 % 250}.{block % 250 + 2}"
        now = self.clock.now()
        inst = Instance(project, zone, name, next(self._uids), kept, machine, model, reservation, ip, now, group=group)
        if run_s is not None:
            inst.run_until = run_s  # relative until RUNNING
        return inst

    def _place(self, inst: Instance, op: Operation | None) -> None:
        """Store ``inst`` if capacity allows (or, FLEX_START, wait); else fail ``op``."""
        now = self.clock.now()
        err = self._shortfall(inst.project, inst.zone, inst.machine, inst.model, inst.reservation, 1)
        if err is None:
            inst.status, inst.ready_at = Status.PROVISIONING, now + self.latency.provision_s
        elif inst.model == "FLEX_START" and (inst.body.get("params") or {}).get("requestValidForDuration"):
            wait = seconds(inst.body["params"]["requestValidForDuration"], "resource.params.requestValidForDuration")
            inst.status, inst.wait_until = Status.PENDING, now + wait
        else:
            if op is not None:  # as Google's: the operation runs, then ends with the stock-out
                op.fail_with = (err, cexc.http_of(err))
            return
        self._instances[(inst.project, inst.zone, inst.name)] = inst

    def insert_instance(
        self, project: str, zone: str, body: dict[str, Any], request_id: str | None = None
    ) -> dict[str, Any]:
        def run() -> dict[str, Any]:
            inst = self._new_instance(project, zone, body)
            op = self._new_op(project, f"zones/{zone}", "insert", inst.path, inst.uid)
            self._place(inst, op)
            return op.to_json(self.link_base)

        return self._insert_call(INSTANCES, project, zone, request_id, run, body)

    def get_instance(self, project: str, zone: str, name: str) -> dict[str, Any]:
        return self._get_call(INSTANCES, project, zone, name)

    def list_instances(self, project: str, zone: str, **page: Unpack[Paging]) -> dict[str, Any]:
        return self._list_call(INSTANCES, project, zone, page)

    def _start_delete(self, inst: Instance, reason: str) -> None:
        now = self.clock.now()
        if inst.status in (Status.PENDING, Status.TERMINATED):
            del self._instances[(inst.project, inst.zone, inst.name)]
            return
        inst.deleting, inst.status, inst.gone_at = True, Status.STOPPING, now + self.latency.delete_s
        self._stop_host(inst, reason)

    def delete_instance(self, project: str, zone: str, name: str, request_id: str | None = None) -> dict[str, Any]:
        def run(inst: Instance) -> dict[str, Any]:  # a group's member: the group creates a new one
            op = self._new_op(project, f"zones/{zone}", "delete", inst.path, inst.uid)
            if not inst.deleting:
                self._start_delete(inst, "deleted")
            return op.to_json(self.link_base)

        return self._delete_call(INSTANCES, project, zone, name, request_id, run)

    # -- time ------------------------------------------------------------------------------------
    def _advance_instances(self, now: float) -> bool:
        changed = False
        for key, inst in list(self._instances.items()):
            if inst.status == Status.PENDING:
                if inst.wait_until is not None and now >= inst.wait_until:
                    self._failures[inst.path] = cexc.zone_exhausted(
                        inst.project, inst.zone, inst.machine.name, inst.model
                    )
                    del self._instances[key]
                    changed = True
                elif self._shortfall(inst.project, inst.zone, inst.machine, inst.model, inst.reservation, 1) is None:
                    inst.status, inst.ready_at = Status.PROVISIONING, now + self.latency.provision_s
                    changed = True
            elif inst.status == Status.PROVISIONING and inst.ready_at <= now:
                inst.status, inst.start_time = Status.RUNNING, now
                if inst.run_until is not None and inst.run_until < 1e9:
                    inst.run_until += now  # maxRunDuration counts from the start
                changed = True
            elif inst.status == Status.STOPPING and inst.deleting and (inst.gone_at or 0) <= now:
                del self._instances[key]
                self._end_preemption(inst, now)  # deleted during its preemption notice
                changed = True
            elif inst.status == Status.STOPPING and inst.preempted and (inst.kill_at or 0) <= now:
                self._terminate(inst, "preempted", now)
                changed = True
            elif inst.status == Status.RUNNING and inst.run_until is not None and now >= inst.run_until:
                self._stop_host(inst, "max-run-duration")
                self._terminate(inst, "max-run-duration", now)
                changed = True
        return changed
