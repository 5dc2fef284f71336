"""Simulated hosts and spot preemption: when a slice's guests start (``ready``), are told to stop
(``terminating``: SIGTERM, the preemption notice) and stop (``stopped``), as ``NodeEvent``s for the
host simulator; ``preempt`` and the end of a preemption live here, in one place."""

from __future__ import annotations

from typing import Any

from infra.local.compute import exceptions as cexc
from infra.local.compute.base import ComputeBase
from infra.local.compute.records import Instance, Status
from infra.local.core import exceptions as exc
from infra.local.core.backend import NodeEvent

PREEMPTED = "compute.instances.preempted"


class HostsMixin(ComputeBase):
    """The guests of RUNNING slices, and spot preemption."""

    # -- simulated hosts --------------------------------------------------------------------------
    def _slice(self, inst: Instance) -> list[Instance] | None:
        """The hosts of ``inst``'s slice, in rank order, once all are RUNNING; else None."""
        if not inst.group:
            return [inst] if inst.status == Status.RUNNING else None
        grp = self._group_of(inst)
        if grp is None:
            return None
        members = sorted(self._members(grp), key=lambda i: i.name)
        if len(members) != grp.target_size or any(m.status != Status.RUNNING for m in members):
            return None
        return members

    def _start_hosts(self) -> bool:
        for inst in list(self._instances.values()):
            if inst.status != Status.RUNNING or (inst.path, inst.uid) in self._hosted:
                continue
            hosts = self._slice(inst)
            if hosts is None:
                continue
            for rank, h in enumerate(hosts):
                if (h.path, h.uid) not in self._hosted:
                    self._hosted.add((h.path, h.uid))
                    self._emit_event(
                        NodeEvent("ready", "created", h.project, h.zone, h.name, self._host_json(h, rank, hosts))
                    )
        return False

    def _host_json(self, inst: Instance, rank: int, hosts: list[Instance]) -> dict[str, Any]:
        return {
            "name": inst.path,
            "id": str(inst.uid),
            "metadata": inst.metadata(),
            "labels": dict(inst.body.get("labels") or {}),
            "machineType": inst.machine.name,
            "acceleratorType": inst.machine.accelerator_type(len(hosts)),
            "workerId": rank,
            "hostname": inst.hostname,
            "hostnames": [h.hostname for h in hosts],
            "networkEndpoints": [{"ipAddress": h.ip} for h in hosts],
            "topology": self._topology(inst),
        }

    def _topology(self, inst: Instance) -> str:
        grp = self._group_of(inst)
        if grp is not None and grp.policy is not None:
            return str((grp.policy.body.get("workloadPolicy") or {}).get("acceleratorTopology") or "")
        return ""

    def _event(self, kind: str, reason: str, inst: Instance) -> None:
        self._emit_event(
            NodeEvent(kind, reason, inst.project, inst.zone, inst.name, {"name": inst.path, "id": str(inst.uid)})
        )

    def _stop_host(self, inst: Instance, reason: str) -> None:
        """The guest stops: SIGTERM, then killed after the simulator's grace (at once after a
        ``terminating`` event, whose grace was the preemption notice)."""
        if (inst.path, inst.uid) in self._hosted:
            self._hosted.discard((inst.path, inst.uid))
            self._event("stopped", reason, inst)

    # -- preemption ------------------------------------------------------------------------------
    def preempt(self, zone: str, name: str, project: str | None = None) -> dict[str, Any]:
        """Spot preemption: STOPPING now (the guest gets SIGTERM), a ``compute.instances.preempted``
        zone operation, and ``preempt_notice_s`` of fake time later TERMINATED (or deleted); for a host
        of a multi-host slice, every running host of the slice."""

        def run() -> dict[str, Any]:
            found = [i for (p, z, n), i in self._instances.items()
                     if z == zone and n == name and (project is None or p == project)]  # fmt: skip
            if not found or found[0].status != Status.RUNNING:
                raise cexc.not_found(f"projects/{project or '*'}/zones/{zone}/instances/{name} (RUNNING)")
            inst = found[0]
            if inst.model != "SPOT":
                raise exc.FailedPrecondition(f"instance {inst.path} is {inst.model}; only SPOT VMs are preempted")
            now = self.clock.now()
            # A multi-host slice (a group with a workload policy) is lost as a whole: every host gets
            # its notice and goes with it (Google: its instances are only ever rescheduled together).
            grp = self._group_of(inst)
            slice_ = [m for m in self._members(grp) if m.status == Status.RUNNING] if grp and grp.policy else [inst]
            for host in slice_:
                host.status, host.preempted, host.kill_at = Status.STOPPING, True, now + self.preempt_notice_s
                op = self._new_op(host.project, f"zones/{zone}", PREEMPTED, host.path, host.uid)
                op.status_message = "Instance was preempted."
                if (host.path, host.uid) in self._hosted:
                    self._event("terminating", "preempted", host)
            return inst.to_json(self.link_base)

        return self._locked(run)

    def _terminate(self, inst: Instance, reason: str, now: float) -> None:
        """The guest is gone: TERMINATED, or deleted if ``instanceTerminationAction`` is DELETE."""
        self._stop_host(inst, reason)
        self._end_preemption(inst, now)
        if inst.termination_action() == "DELETE" and not inst.group:
            del self._instances[(inst.project, inst.zone, inst.name)]
            return
        inst.status, inst.stop_time = Status.TERMINATED, now
        if reason == "preempted":
            inst.status_message = "Instance was preempted."

    def _end_preemption(self, inst: Instance, now: float) -> None:
        for op in self._ops.values():
            if op.op_type == PREEMPTED and op.target_id == inst.uid:
                op.finish(now)
