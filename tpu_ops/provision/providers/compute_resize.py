"""Compute Engine slices obtained through MIG resize requests: multi-host flex-start, and calendar rungs.

Google's pages this follows:
- "About resize requests in a MIG": a resize request creates ``resizeBy`` VMs all at once (never
  part of a slice), each for ``requestedRunDuration`` (10 minutes to 7 days), on a group whose
  template uses the FLEX_START or RESERVATION_BOUND provisioning model; states CREATING → ACCEPTED →
  SUCCEEDED | FAILED | CANCELLED; only an ACCEPTED request can be cancelled, a finished one deleted.
- "Create a resize request in a MIG": the group is created with target size 0, then the request adds
  the hosts (``resizeBy`` = hosts).
- "Create a future reservation request in calendar mode" / "Consume reserved capacity": a calendar
  reservation's auto-created reservation is consumed through a resize request on a group over a
  RESERVATION_BOUND template with a SPECIFIC_RESERVATION affinity; the group creates the VMs at or
  after the window's start, and Compute Engine deletes them at its end.

So a multi-host ``flex-start`` slice and every ``calendar`` slice is: a workload policy (multi-host),
a template ``{slice}-t{hash}``, a group ``{slice}`` of target size 0 (not BULK) and a resize request
``{slice}-rr``. Teardown and the reaper find the request through its group and remove it first:
cancel (if ACCEPTED) → delete the request → group → template → policy.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import ClassVar, Final

from tpu_ops.cloud.compute import classify, vm_body
from tpu_ops.cloud.compute_resize import ComputeResizeApi, FutureReservationRecord, ResizeRecord, ResizeState
from tpu_ops.errors import AlreadyExistsError, CapacityError, CloudError, DeadlineError, NotFoundError, TpuOpsError
from tpu_ops.provision.calendar import REFUSALS, CalendarWindow, reserved
from tpu_ops.provision.providers.base import Phase, SliceRecord, SliceRequest
from tpu_ops.provision.providers.compute import GROUP, ComputeProvider
from tpu_ops.provision.providers.compute_groups import marker, policy_name
from tpu_ops.provision.records import Resource
from tpu_ops.settings import Settings
from tpu_ops.tiers import Tier

RESIZE: Final = "resize-request"
RESIZE_TIERS: Final = frozenset({Tier.FLEX_START, Tier.CALENDAR})
MIN_RUN_S, MAX_RUN_S = 600, 7 * 86400


def request_name(slice_id: str) -> str:
    return f"{slice_id}-rr"


def group_of(name: str) -> str:
    return name.removesuffix("-rr")


class ComputeResizeProvider(ComputeProvider):
    """:class:`ComputeProvider` with resize-request slices (flex-start multi-host, calendar)."""

    tiers: ClassVar[frozenset[str]] = ComputeProvider.tiers
    api: ComputeResizeApi

    def __init__(self, settings: Settings, api: ComputeResizeApi | None = None) -> None:
        super().__init__(settings, api or ComputeResizeApi(settings))

    @staticmethod
    def uses_resize(req: SliceRequest) -> bool:
        return req.tier == Tier.CALENDAR or (req.tier == Tier.FLEX_START and req.accelerator.hosts > 1)

    # -- calendar reservations ---------------------------------------------------------------
    def calendar_window(self, zone: str, name: str) -> CalendarWindow | None:
        """The future reservation ``name`` in ``zone`` (None if there is none)."""
        fr = self.api.get_future_reservation(zone, name.rsplit("/", 1)[-1])
        return None if fr is None else _window(fr)

    def calendar_windows(self, zones: Sequence[str]) -> list[CalendarWindow]:
        """Every future reservation in ``zones`` (what ``tpu-ops capacity calendar`` shows)."""
        return [_window(fr) for fr in self.api.list_future_reservations(zones)]

    def _named_window(self, zone: str, name: str) -> CalendarWindow | None:
        """The window, once the reservation it creates has a name: a calendar reservation booked
        without ``reservationName`` names it only when its window opens (the ladder's gate let us
        wait that long), so poll until then, or until Google declines or fails it."""
        window = self.calendar_window(zone, name)
        while (
            window is not None and not window.reservation and not window.refusal and window.opens_in(time.time()) > -60
        ):
            time.sleep(max(self.settings.poll_interval_s, min(5.0, window.opens_in(time.time()))))
            window = self.calendar_window(zone, name)
        return window

    # -- create ------------------------------------------------------------------------------
    def create(self, req: SliceRequest) -> None:
        if not self.uses_resize(req):
            super().create(req)
            return
        desc = marker(req)
        run_s = req.max_run_duration_s or 86400
        base = req
        if req.tier == Tier.CALENDAR:
            window = self._named_window(req.zone, req.reservation)
            if window is not None and window.refusal:  # declined or failed: a refusal, as a stock-out is
                if REFUSALS[window.status][0]:
                    raise CapacityError(f"compute: {window.refusal}", zone=req.zone, tier=req.tier)
                raise CloudError(f"compute: {window.refusal}", service="compute")
            if window is None or not window.reservation:
                raise NotFoundError(f"compute: calendar reservation {req.reservation!r} in {req.zone} has no "
                                    "reservation to consume (not found, or not named before its window)")  # fmt: skip
            base = replace(req, tier=Tier.RESERVATION, reservation=window.reservation)
            if window.end is not None:  # the VMs go with the reservation anyway; ask no longer than it lasts
                run_s = min(run_s, int(window.end - max(time.time(), window.start or 0.0)))
        run_s = max(MIN_RUN_S, min(MAX_RUN_S, run_s))
        spec = replace(self.vm_spec(base, desc), request_valid_for_s=None)
        policy = ""
        if req.accelerator.hosts > 1:
            policy = policy_name(req.slice_id)
            with contextlib.suppress(AlreadyExistsError):  # an earlier try of this attempt made it
                self._settle(self.api.insert_policy(req.region, policy, req.accelerator.topology, desc))
        content = re.sub(r" created=[0-9]+", "", json.dumps(vm_body(replace(spec, labels={}), None), sort_keys=True))
        template = f"{req.slice_id}-t{hashlib.sha256(content.encode()).hexdigest()[:10]}"
        with contextlib.suppress(AlreadyExistsError):
            self._settle(self.api.insert_template(template, spec))
        with contextlib.suppress(AlreadyExistsError):
            self._settle(self.api.insert_resize_group(req.zone, req.slice_id, template, req.region, policy, desc,
                                                      req.tier))  # fmt: skip
        ref = self.api.insert_resize_request(req.zone, req.slice_id, request_name(req.slice_id),
                                             req.accelerator.hosts, run_s, desc, req.tier)  # fmt: skip
        self._ops[(req.zone, req.slice_id)] = ref

    # -- reads -------------------------------------------------------------------------------
    def describe(self, zone: str, slice_id: str) -> SliceRecord | None:
        rec = super().describe(zone, slice_id)
        if rec is None or rec.tier not in RESIZE_TIERS or rec.hosts or rec.state not in (Phase.WAITING,):
            return rec
        rr = self.api.get_resize_request(zone, slice_id, request_name(slice_id))
        if rr is None:
            return rec
        return self._with_request(rec, rr)

    @staticmethod
    def _with_request(rec: SliceRecord, rr: ResizeRecord) -> SliceRecord:
        raw = f"resize request {rr.state}"
        if rr.state in ("FAILED", "CANCELLED"):
            err = classify(rr.errors or (f"{rr.state}: resize request {rr.name} {rr.state.lower()}",),
                           zone=rec.zone, tier=rec.tier)  # fmt: skip
            return replace(rec, state=Phase.FAILED, raw_state=raw, detail=str(err),
                           stockout=isinstance(err, CapacityError))  # fmt: skip
        if rr.last_errors:
            raw += f" (last attempt: {rr.last_errors[0][:120]})"
        return replace(rec, raw_state=raw)

    def resources(self, zones: Sequence[str], run_id: str | None = None) -> list[Resource]:
        out = super().resources(zones, run_id)
        for g in [r for r in out if r.kind == GROUP]:
            try:
                found = self.api.list_resize_requests(g.zone, g.resource_id)
            except TpuOpsError:
                continue  # the group is going; teardown and the reaper look again
            for rr in found:
                if rr.name == request_name(g.resource_id):
                    out.append(Resource(RESIZE, g.zone, rr.name, g.run_id, rr.state, g.tier, g.accelerator_type,
                                        rr.created_at, self.name))  # fmt: skip
        return out

    # -- delete: resize requests first ---------------------------------------------------------
    def request_delete(self, resources: Sequence[Resource]) -> None:
        for r in resources:
            if r.kind == RESIZE:
                with contextlib.suppress(TpuOpsError):
                    self._drop_request(r)
        super().request_delete([r for r in resources if r.kind != RESIZE])

    def delete(self, resources: Sequence[Resource], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        pending = {(r.zone, r.resource_id): r for r in resources if r.kind == RESIZE}
        while pending:
            for key, r in list(pending.items()):
                try:
                    if self._drop_request(r):
                        del pending[key]
                except TpuOpsError:
                    continue  # e.g. CREATING: it can neither be cancelled nor deleted yet
            if not pending:
                break
            if time.monotonic() > deadline:
                raise DeadlineError(f"compute: resize requests still there after the deadline: {sorted(pending)}")
            time.sleep(self.settings.poll_interval_s)
        rest = [r for r in resources if r.kind != RESIZE]
        if rest:
            super().delete(rest, max(1.0, deadline - time.monotonic()))

    def _drop_request(self, r: Resource) -> bool:
        """One step towards the request being gone: cancel it, or delete it; True once it is gone."""
        group = group_of(r.resource_id)
        cur = self.api.get_resize_request(r.zone, group, r.resource_id)
        if cur is None:
            return True
        if cur.state in ResizeState.CANCELLABLE:
            self.api.cancel_resize_request(r.zone, group, r.resource_id)
        elif cur.state in ResizeState.TERMINAL:
            return not self.api.delete_resize_request(r.zone, group, r.resource_id) or self._gone(r, group)
        return False

    def _gone(self, r: Resource, group: str) -> bool:
        return self.api.get_resize_request(r.zone, group, r.resource_id) is None


def _window(fr: FutureReservationRecord) -> CalendarWindow:
    gen, chips = reserved(fr.machine_type, fr.count, fr.vm_family)
    return CalendarWindow(fr.name, fr.zone, fr.start, fr.end, fr.mode, fr.status, fr.reservation, gen, chips)
