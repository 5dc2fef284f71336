"""Compute Engine resize requests and future (calendar-mode) reservations, as typed records.

:class:`ComputeResizeApi` is :class:`tpu_ops.cloud.compute.ComputeApi` plus
``InstanceGroupManagerResizeRequestsClient`` and ``FutureReservationsClient`` calls, built with the
same credentials and ``client_options``. Writes use the ``*_unary`` methods and hand back an
:class:`OpRef` polled by ``ComputeApi.operation`` (never ``.result()``: it polls Google's real host).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from tpu_ops.cloud.compute import ComputeApi, OpRef, _error_lines, _leaf, _ts, compute_errors
from tpu_ops.errors import NotFoundError

RR_CLIENT: Final = "InstanceGroupManagerResizeRequestsClient"
FR_CLIENT: Final = "FutureReservationsClient"


class ResizeState:
    """``InstanceGroupManagerResizeRequest.state`` grouped by what the caller does about it."""

    WAITING: Final = frozenset({"CREATING", "ACCEPTED"})
    CANCELLABLE: Final = frozenset({"ACCEPTED"})
    TERMINAL: Final = frozenset({"SUCCEEDED", "FAILED", "CANCELLED"})


@dataclass(frozen=True)
class ResizeRecord:
    """One resize request of a group."""

    group: str
    zone: str
    name: str
    state: str
    resize_by: int
    run_s: int
    description: str
    created_at: float | None
    errors: tuple[str, ...] = ()  # status.error (FAILED): ``CODE: message``
    last_errors: tuple[str, ...] = ()  # status.lastAttempt.error (still waiting)


@dataclass(frozen=True)
class FutureReservationRecord:
    """A future reservation: its window, mode and what it has delivered."""

    name: str
    zone: str
    mode: str  # CALENDAR | DEFAULT
    start: float | None
    end: float | None
    status: str  # procurementStatus
    reservation_name: str  # the name asked for the auto-created reservation ("" if none)
    auto_created: tuple[str, ...]  # names of the reservations it created (during its window)
    machine_type: str
    count: int  # VMs (specific SKU) or chips (aggregate)
    vm_family: str = ""

    @property
    def reservation(self) -> str:
        """The reservation a template targets: the auto-created one, else the name asked for."""
        return self.auto_created[0] if self.auto_created else self.reservation_name


class ComputeResizeApi(ComputeApi):
    """``ComputeApi`` with resize requests and future reservations."""

    # -- resize requests ---------------------------------------------------------------------
    def insert_resize_group(self, zone: str, name: str, template: str, policy_region: str, policy: str,
                            description: str, tier: str) -> OpRef:  # fmt: skip
        """A group of target size 0 that resize requests grow (not BULK: each request is all-or-nothing
        itself); DO_NOTHING leaves a failed VM for us to see. ``policy``: a workload policy, or ""."""
        from google.cloud import compute_v1

        igm = compute_v1.InstanceGroupManager(
            name=name, description=description, base_instance_name=name, target_size=0,
            instance_template=f"projects/{self.project}/global/instanceTemplates/{template}",
            instance_lifecycle_policy=compute_v1.InstanceGroupManagerInstanceLifecyclePolicy(
                default_action_on_failure="DO_NOTHING"),
        )  # fmt: skip
        if policy:
            igm.resource_policies = compute_v1.InstanceGroupManagerResourcePolicies(
                workload_policy=f"projects/{self.project}/regions/{policy_region}/resourcePolicies/{policy}"
            )
        with compute_errors(zone=zone, tier=tier):
            op = self.client("InstanceGroupManagersClient").insert_unary(
                project=self.project, zone=zone, instance_group_manager_resource=igm, timeout=self.call_timeout_s
            )
        return OpRef("zone", zone, op.name, zone, tier)

    def insert_resize_request(
        self, zone: str, group: str, name: str, resize_by: int, run_s: int, description: str, tier: str
    ) -> OpRef:
        """Ask ``group`` for ``resize_by`` VMs at once, each deleted after ``run_s`` (not retried here)."""
        from google.cloud import compute_v1

        rr = compute_v1.InstanceGroupManagerResizeRequest(
            name=name, description=description, resize_by=resize_by,
            requested_run_duration=compute_v1.Duration(seconds=int(run_s)),
        )  # fmt: skip
        with compute_errors(zone=zone, tier=tier):
            op = self.client(RR_CLIENT).insert_unary(
                project=self.project, zone=zone, instance_group_manager=group,
                instance_group_manager_resize_request_resource=rr, timeout=self.call_timeout_s,
            )  # fmt: skip
        return OpRef("zone", zone, op.name, zone, tier)

    @staticmethod
    def _rr(r: Any, zone: str, group: str) -> ResizeRecord:
        st = r.status
        return ResizeRecord(
            group=group, zone=zone, name=r.name, state=str(r.state), resize_by=int(r.resize_by),
            run_s=int(r.requested_run_duration.seconds) if r.requested_run_duration else 0,
            description=r.description, created_at=_ts(r.creation_timestamp),
            errors=_error_lines(st.error) if st else (),
            last_errors=_error_lines(st.last_attempt.error) if st and st.last_attempt else (),
        )  # fmt: skip

    def list_resize_requests(self, zone: str, group: str) -> list[ResizeRecord]:
        """The group's resize requests ([] if the group is gone)."""
        c = self.client(RR_CLIENT)
        try:
            items = self._call(lambda: list(c.list(project=self.project, zone=zone, instance_group_manager=group,
                                                   timeout=self.call_timeout_s)))  # fmt: skip
        except NotFoundError:
            return []
        return [self._rr(r, zone, group) for r in items]

    def get_resize_request(self, zone: str, group: str, name: str) -> ResizeRecord | None:
        try:
            r = self._call(lambda: self.client(RR_CLIENT).get(
                project=self.project, zone=zone, instance_group_manager=group, resize_request=name,
                timeout=self.call_timeout_s))  # fmt: skip
        except NotFoundError:
            return None
        return self._rr(r, zone, group)

    def cancel_resize_request(self, zone: str, group: str, name: str) -> bool:
        """Cancel an ACCEPTED request; False if it is gone."""
        try:
            self._call(lambda: self.client(RR_CLIENT).cancel_unary(
                project=self.project, zone=zone, instance_group_manager=group, resize_request=name,
                timeout=self.call_timeout_s))  # fmt: skip
        except NotFoundError:
            return False
        return True

    def delete_resize_request(self, zone: str, group: str, name: str) -> bool:
        """Delete a SUCCEEDED, FAILED or CANCELLED request; False if it is gone."""
        try:
            self._call(lambda: self.client(RR_CLIENT).delete_unary(
                project=self.project, zone=zone, instance_group_manager=group, resize_request=name,
                timeout=self.call_timeout_s))  # fmt: skip
        except NotFoundError:
            return False
        return True

    # -- future reservations (read only: booking, cancelling, deleting are the operator's) -----
    @staticmethod
    def _fr(f: Any, zone: str) -> FutureReservationRecord:
        sku, agg = f.specific_sku_properties, f.aggregate_reservation
        machine, count, family = "", 0, ""
        if sku and sku.total_count:
            machine, count = _leaf(sku.instance_properties.machine_type), int(sku.total_count)
        elif agg:
            family = agg.vm_family
            count = sum(int(r.accelerator.accelerator_count) for r in agg.reserved_resources if r.accelerator)
        st = f.status
        return FutureReservationRecord(
            name=f.name, zone=_leaf(f.zone) or zone, mode=f.reservation_mode or "DEFAULT",
            start=_ts(f.time_window.start_time), end=_ts(f.time_window.end_time),
            status=st.procurement_status if st else "", reservation_name=f.reservation_name,
            auto_created=tuple(_leaf(u) for u in (st.auto_created_reservations if st else [])),
            machine_type=machine, count=count, vm_family=family,
        )  # fmt: skip

    def get_future_reservation(self, zone: str, name: str) -> FutureReservationRecord | None:
        try:
            f = self._call(lambda: self.client(FR_CLIENT).get(
                project=self.project, zone=zone, future_reservation=name, timeout=self.call_timeout_s))  # fmt: skip
        except NotFoundError:
            return None
        return self._fr(f, zone)

    def list_future_reservations(self, zones: Sequence[str] = ("-",)) -> list[FutureReservationRecord]:
        """Future reservations of ``zones`` (``-``: every zone, by aggregated list)."""
        c = self.client(FR_CLIENT)
        if list(zones) == ["-"]:
            pairs = self._call(lambda: list(c.aggregated_list(project=self.project, timeout=self.call_timeout_s)))
            return [self._fr(f, _leaf(scope)) for scope, scoped in pairs for f in scoped.future_reservations]
        out: list[FutureReservationRecord] = []
        for zone in zones:
            out += [self._fr(f, zone) for f in self._list_zone(c, zone)]
        return out

    def _list_zone(self, c: Any, zone: str) -> list[Any]:
        return self._call(lambda: list(c.list(project=self.project, zone=zone, timeout=self.call_timeout_s)))
