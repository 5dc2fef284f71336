"""Future reservations (``futureReservations``), calendar mode included, as Google documents them.

A request names capacity (``specificSkuProperties``: ``instanceProperties.machineType`` and
``totalCount`` VMs, or for TPUs ``aggregateReservation``: ``vmFamily`` and accelerator counts) for a
``timeWindow`` (``startTime`` and ``endTime`` or ``duration``). ``reservationMode: CALENDAR`` windows
last 1 to 90 days. Google's "Delete a future reservation request in calendar mode": a calendar request
can be cancelled ("to prevent Compute Engine from provisioning your requested resources and incurring
charges for them"), then kept (``CANCELLED``) or deleted; it can be deleted "after you cancel a request
or after the request reaches its end time", and not otherwise (a 400 here). The fake cancels one only
while it is PENDING_APPROVAL or APPROVED, i.e. before its window opens (its reading of the overview
page's limits, see docs/calendar.md): nothing was delivered, so nothing is removed, and its chips no
longer count against the zone's calendar capacity. ``status.procurementStatus`` is PENDING_APPROVAL on insert;
Google's review then approves or declines it. The fake's review of a calendar request weighs the
zone's calendar capacity (``/_fake/capacity`` ``{zone: {"CALENDAR": chips | {generation: chips}}}``,
4096 chips of every generation by default): APPROVED if the chips it asks for fit beside those the
approved requests of the same generation hold at every moment of its window, else DECLINED (the
compute.v1 ``FutureReservationStatus`` has no field saying why, so neither does the fake). When the
window opens an approved request is FULFILLED: Compute Engine auto-creates a reservation
(``reservationName``, else ``<namePrefix|name>-<id>``) listed in ``status.autoCreatedReservations``,
and at the end of the window deletes it and every VM that consumes it; if the capacity was lowered
meanwhile and its chips no longer fit, it is FAILED ("No additional reservations were provided") and
nothing is created. Resize requests consume it (:mod:`.resize`): one made before the window waits.
Requests in DEFAULT mode are approved as before.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Unpack

from infra.local.compute import exceptions as cexc
from infra.local.compute.base import AGGREGATED, API, Paging, last, seconds
from infra.local.compute.capacity import Reservation
from infra.local.compute.machines import MACHINE_TYPES
from infra.local.compute.placement import RESERVATION_KEY
from infra.local.compute.records import Kind, timestamp
from infra.local.compute.resize import ResizeMixin
from infra.local.core import exceptions as exc

DAY = 86400.0
ENDED = ("CANCELLED", "DECLINED", "FAILED")  # procurement states that will never deliver
HOLDING = ("APPROVED", "FULFILLED")  # calendar requests that hold calendar capacity
# aggregateReservation.vmFamily -> the machine type its auto-created reservation holds
VM_FAMILIES = {
    "VM_FAMILY_CLOUD_TPU_POD_SLICE_CT5P": "ct5p-hightpu-4t",
    "VM_FAMILY_CLOUD_TPU_LITE_POD_SLICE_CT6E": "ct6e-standard-4t",
    "VM_FAMILY_CLOUD_TPU_POD_SLICE_TPU7X": "tpu7x-standard-4t",
}


@dataclass
class FutureReservation:
    project: str
    zone: str
    name: str
    uid: int
    body: dict[str, Any]
    create_time: float
    start: float
    end: float
    count: int  # VMs
    machine_type: str
    reservation: str  # the auto-created reservation's name
    status: str = "PENDING_APPROVAL"
    delivered: bool = False
    ended: bool = False

    @property
    def path(self) -> str:
        return FUTURES.path(self.project, self.zone, self.name)

    @property
    def calendar(self) -> bool:
        return self.body.get("reservationMode") == "CALENDAR"


FUTURES: Kind[FutureReservation] = Kind("futureReservations", "_futures", "zone", "compute#futureReservation")
AGGREGATED[FUTURES.collection] = FUTURES


def _time(value: Any, field: str) -> float:
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError:
        raise cexc.Invalid(f"Invalid value for field '{field}': {value!r}. Expected an RFC 3339 time.") from None


class FutureReservationsMixin(ResizeMixin):
    """``futureReservations.*`` of zones, and the auto-created reservations of their windows."""

    def _clear(self) -> None:
        super()._clear()
        self._futures: dict[tuple[str, str, str], FutureReservation] = {}

    def _sku(self, body: dict[str, Any]) -> tuple[int, str]:
        """(VM count, machine type) the request reserves."""
        sku: dict[str, Any] = body.get("specificSkuProperties") or {}
        agg: dict[str, Any] = body.get("aggregateReservation") or {}
        if bool(sku) == bool(agg):
            raise cexc.Invalid("Invalid value for field 'resource': exactly one of specificSkuProperties and "
                               "aggregateReservation is required.")  # fmt: skip
        if sku:
            machine = self._machine((sku.get("instanceProperties") or {}).get("machineType"),
                                    "resource.specificSkuProperties.instanceProperties.machineType")  # fmt: skip
            count = int(sku.get("totalCount") or 0)
            if count < 1:
                raise cexc.Invalid(f"Invalid value for field 'resource.specificSkuProperties.totalCount': "
                                   f"{sku.get('totalCount')!r}. Must be at least 1.")  # fmt: skip
            return count, machine.name
        family = agg.get("vmFamily")
        if family not in VM_FAMILIES:
            raise cexc.Invalid(f"Invalid value for field 'resource.aggregateReservation.vmFamily': {family!r}; "
                               f"allowed: {', '.join(sorted(VM_FAMILIES))}")  # fmt: skip
        chips = sum(int((r.get("accelerator") or {}).get("acceleratorCount") or 0)
                    for r in agg.get("reservedResources") or [])  # fmt: skip
        mt = MACHINE_TYPES[VM_FAMILIES[family]]
        if chips < 1 or chips % mt.chips:
            raise cexc.Invalid(
                f"Invalid value for field 'resource.aggregateReservation.reservedResources': {chips} chips is "
                f"not a whole number of {mt.name} VMs ({mt.chips} chips each)."
            )
        return chips // mt.chips, mt.name

    def insert_future_reservation(
        self, project: str, zone: str, body: dict[str, Any], request_id: str | None = None
    ) -> dict[str, Any]:
        def build(name: str) -> FutureReservation:
            mode = body.get("reservationMode") or "DEFAULT"
            if mode not in ("CALENDAR", "DEFAULT"):
                raise cexc.Invalid(f"Invalid value for field 'resource.reservationMode': {mode!r}; allowed: "
                                   "CALENDAR, DEFAULT")  # fmt: skip
            count, machine = self._sku(body)
            win = body.get("timeWindow") or {}
            if not win.get("startTime"):
                raise cexc.Invalid("Required field 'resource.timeWindow.startTime' not specified")
            start = _time(win["startTime"], "resource.timeWindow.startTime")
            if win.get("endTime"):
                end = _time(win["endTime"], "resource.timeWindow.endTime")
            elif win.get("duration"):
                end = start + seconds(win["duration"], "resource.timeWindow.duration")
            else:
                raise cexc.Invalid("Invalid value for field 'resource.timeWindow': endTime or duration is required")
            if start < self.clock.now() - 60:
                raise cexc.Invalid(f"Invalid value for field 'resource.timeWindow.startTime': {win['startTime']!r}. "
                                   "The start time must be in the future.")  # fmt: skip
            if mode == "CALENDAR" and not DAY <= end - start <= 90 * DAY:
                raise cexc.Invalid("Invalid value for field 'resource.timeWindow': a future reservation in calendar "
                                   f"mode lasts 1 to 90 days, not {(end - start) / DAY:.2f} days.")  # fmt: skip
            if end <= start:
                raise cexc.Invalid("Invalid value for field 'resource.timeWindow': endTime must be after startTime")
            uid = next(self._uids)
            res = str(body.get("reservationName") or f"{body.get('namePrefix') or name}-{uid % 10**6:06d}")
            kept = {k: v for k, v in body.items() if k not in ("kind", "id", "selfLink", "status", "zone")}
            return FutureReservation(project, zone, name, uid, kept, self.clock.now(), start, end, count, machine, res)

        return self._insert_now(FUTURES, project, zone, body, request_id, build)

    def _future_json(self, fr: FutureReservation) -> dict[str, Any]:
        base = self.link_base
        out: dict[str, Any] = {"kind": "compute#futureReservation", "id": str(fr.uid)}
        out.update(fr.body)
        out.update({
            "name": fr.name, "zone": f"{base}projects/{fr.project}/zones/{fr.zone}", "selfLink": base + fr.path,
            "selfLinkWithId": base + FUTURES.path(fr.project, fr.zone, str(fr.uid)),
            "creationTimestamp": timestamp(fr.create_time), "planningStatus": "SUBMITTED",
            "reservationMode": fr.body.get("reservationMode") or "DEFAULT",
            "timeWindow": {"startTime": _rfc3339(fr.start), "endTime": _rfc3339(fr.end)},
        })  # fmt: skip
        status: dict[str, Any] = {"procurementStatus": fr.status}
        if fr.delivered:
            link = f"{base}projects/{fr.project}/zones/{fr.zone}/reservations/{fr.reservation}"
            status["autoCreatedReservations"] = [link]
            status["fulfilledCount"] = str(fr.count)
        if fr.calendar:
            out.setdefault("autoDeleteAutoCreatedReservations", True)
            out.setdefault("autoCreatedReservationsDeleteTime", _rfc3339(fr.end))
        out["status"] = status
        return out

    def _render(self, rec: Any) -> dict[str, Any]:
        return self._future_json(rec) if isinstance(rec, FutureReservation) else super()._render(rec)

    def get_future_reservation(self, project: str, zone: str, name: str) -> dict[str, Any]:
        return self._get_call(FUTURES, project, zone, name)

    def list_future_reservations(self, project: str, zone: str, **page: Unpack[Paging]) -> dict[str, Any]:
        out = self._list_call(FUTURES, project, zone, page)
        out["kind"] = "compute#futureReservationsListResponse"
        return out

    def aggregated_future_reservations(self, project: str, flt: str | None = None) -> dict[str, Any]:
        out = self.aggregated_list(project, FUTURES.collection, flt)
        out["kind"] = out["id"] = "compute#futureReservationsAggregatedListResponse"
        return out

    def _unsubmit(self, project: str, zone: str, name: str, request_id: str | None, verb: str) -> dict[str, Any]:
        """Cancel or delete; in calendar mode only where Google's page allows it (:func:`_calendar_refusal`)."""

        def run(fr: FutureReservation) -> dict[str, Any]:
            if fr.calendar and (why := _calendar_refusal(fr, verb, self.clock.now())):
                raise exc.InvalidArgument(why, reason="invalid")
            if not fr.calendar:  # a calendar request reaching here has no auto-created reservation left
                self._deliver(fr, False)
            if verb == "delete":
                del self._futures[(project, zone, name)]
            else:
                fr.status = "CANCELLED"
            return self._done_op(project, f"zones/{zone}", verb, fr.path, fr.uid)

        if verb == "delete":
            return self._delete_call(FUTURES, project, zone, name, request_id, run)
        path = API + FUTURES.path(project, zone, name) + "/cancel"
        return self._call("POST", path, self._once(request_id, lambda: run(self._get(FUTURES, project, zone, name))))

    def cancel_future_reservation(self, project: str, zone: str, name: str, request_id: str | None = None
                                  ) -> dict[str, Any]:  # fmt: skip
        return self._unsubmit(project, zone, name, request_id, "cancel")

    def delete_future_reservation(self, project: str, zone: str, name: str, request_id: str | None = None
                                  ) -> dict[str, Any]:  # fmt: skip
        return self._unsubmit(project, zone, name, request_id, "delete")

    # -- time ------------------------------------------------------------------------------------
    def _deliver(self, fr: FutureReservation, on: bool) -> None:
        """Make (``on``) or remove the auto-created reservation in the zone's capacity."""
        zc = self.capacity.zone(fr.zone)
        if on:
            zc.reservations[fr.reservation] = Reservation(fr.count, fr.machine_type)
        else:
            zc.reservations.pop(fr.reservation, None)
        self.capacity.zones[fr.zone] = zc

    def _chips(self, fr: FutureReservation) -> tuple[str, int]:
        mt = MACHINE_TYPES[fr.machine_type]
        return mt.generation, fr.count * mt.chips

    def _fits(self, fr: FutureReservation, at: list[float], delivered: bool = False) -> bool:
        """Whether ``fr``'s chips fit beside those the other approved (``delivered``: fulfilled) calendar
        requests of its zone and generation hold at each moment of ``at`` (a window's peak is at a start)."""
        gen, chips = self._chips(fr)
        others = [o for o in self._futures.values() if o is not fr and o.calendar and o.zone == fr.zone
                  and (o.delivered if delivered else o.status in HOLDING) and not o.ended
                  and self._chips(o)[0] == gen]  # fmt: skip
        held = max((sum(self._chips(o)[1] for o in others if o.start <= t < o.end) for t in at), default=0)
        return held + chips <= self.capacity.zone(fr.zone).calendar_chips(gen)

    def _review(self, fr: FutureReservation) -> str:
        """Google's review of a submitted request: APPROVED or DECLINED (calendar capacity)."""
        if not fr.calendar:
            return "APPROVED"
        starts = [fr.start] + [o.start for o in self._futures.values() if fr.start < o.start < fr.end]
        return "APPROVED" if self._fits(fr, starts) else "DECLINED"

    def _advance_futures(self, now: float) -> bool:
        changed = False
        for fr in sorted(self._futures.values(), key=lambda f: f.uid):  # first come, first served
            if fr.status in ENDED:
                continue
            if fr.status == "PENDING_APPROVAL":
                fr.status, changed = self._review(fr), True
                if fr.status in ENDED:
                    continue
            if fr.start <= now < fr.end:
                if fr.calendar and not fr.delivered and not self._fits(fr, [now], delivered=True):
                    fr.status, changed = "FAILED", True  # the capacity went meanwhile: nothing is delivered
                    continue
                if fr.reservation not in self.capacity.zone(fr.zone).reservations:
                    self._deliver(fr, True)  # again if someone reconfigured the zone's reservations
                    changed = True
                if not fr.delivered:
                    fr.status, fr.delivered = "FULFILLED", True
            elif now >= fr.end and not fr.ended:
                fr.ended, changed = True, True
                self._deliver(fr, False)
                for inst in list(self._instances.values()):  # and every VM that consumes it
                    if inst.zone == fr.zone and inst.reservation == fr.reservation and not inst.deleting:
                        self._start_delete(inst, "reservation-ended")
        return changed

    def _reservation_coming(self, project: str, zone: str, props: dict[str, Any], now: float) -> bool:
        """Whether the reservation ``props`` consume is a calendar one whose window opens after ``now``: the
        moment the caller's pass judged the windows at (a fresh clock read could fall after a start that pass
        did not deliver yet, and fail a request the next pass would fill)."""
        aff = props.get("reservationAffinity") or {}
        if aff.get("key") != RESERVATION_KEY or not aff.get("values"):
            return False
        name = last(str(aff["values"][0]))
        return any(
            fr.project == project and fr.zone == zone and fr.reservation == name and now < fr.start
            and fr.status not in ENDED
            for fr in self._futures.values()
        )  # fmt: skip


def _calendar_refusal(fr: FutureReservation, verb: str, now: float) -> str:
    """Why a calendar request may not be cancelled or deleted now ('' if it may)."""
    if verb == "cancel":
        if fr.status in ("PENDING_APPROVAL", "APPROVED"):
            return ""
        return (f"The future reservation '{fr.path}' is in calendar mode and {fr.status}: only a request pending "
                f"approval or approved, before its start time ({_rfc3339(fr.start)}), can be cancelled.")  # fmt: skip
    if fr.status == "CANCELLED" or now >= fr.end:
        return ""
    return (f"The future reservation '{fr.path}' is in calendar mode and {fr.status}: it can be deleted only after "
            f"it is cancelled or after its end time ({_rfc3339(fr.end)}).")  # fmt: skip


def _rfc3339(t: float) -> str:
    return timestamp(t).replace("-00:00", "Z")
