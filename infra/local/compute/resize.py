"""Resize requests of zonal managed instance groups (``instanceGroupManagerResizeRequests``).

As Google's "About resize requests in a MIG" describes them: a request names ``resizeBy`` VMs and a
``requestedRunDuration`` (10 minutes to 7 days; optional for FLEX_START and reservation-bound groups,
as gcloud's help says); on insert the group's target size grows by
``resizeBy`` and the request is CREATING, then ACCEPTED. An ACCEPTED request creates all its VMs at
once when capacity allows (never part of them); until then it waits (a stock-out is not a failure:
the scheduler waits for capacity), with the last attempt's error in ``status.lastAttempt``. It then
SUCCEEDED, and its VMs are deleted when the run duration ends. A reservation-bound request waits for
its reservation to exist while a future (calendar) reservation will create it, and FAILED (with
``status.error``) when nothing will; so does one that would exceed a quota. Only an ACCEPTED request
can be cancelled (the target size shrinks back); only a SUCCEEDED, FAILED or CANCELLED one deleted.
Deleting the group removes its requests. Supported only on templates whose provisioning model is
FLEX_START or RESERVATION_BOUND.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Any

from infra.local.compute import exceptions as cexc
from infra.local.compute.base import API, check_name, seconds
from infra.local.compute.groups import GroupsMixin
from infra.local.compute.records import GROUPS, Group, Operation, Status, timestamp
from infra.local.core import exceptions as exc

MIN_RUN_S, MAX_RUN_S = 600, 7 * 86400
MODELS = ("FLEX_START", "RESERVATION_BOUND")


class State:
    CREATING, ACCEPTED, SUCCEEDED = "CREATING", "ACCEPTED", "SUCCEEDED"
    FAILED, CANCELLED = "FAILED", "CANCELLED"
    WAITING = frozenset({CREATING, ACCEPTED})
    TERMINAL = frozenset({SUCCEEDED, FAILED, CANCELLED})


@dataclass
class ResizeRequest:
    project: str
    zone: str
    group: str
    name: str
    uid: int
    resize_by: int
    run_s: float | None  # requestedRunDuration; None: the template's (flex-start) or the reservation's end
    description: str
    create_time: float
    op: Operation
    state: str = State.CREATING
    error: dict[str, Any] | None = None  # status.error (FAILED)
    last_error: dict[str, Any] | None = None  # status.lastAttempt.error (still waiting)
    instances: list[str] = field(default_factory=list)
    run_until: float | None = None
    expired: bool = False  # its VMs were deleted at the end of the run duration

    @property
    def path(self) -> str:
        return f"{GROUPS.path(self.project, self.zone, self.group)}/resizeRequests/{self.name}"


def _error(code: str, message: str) -> dict[str, Any]:
    return {"errors": [{"code": code, "message": message}]}


class ResizeMixin(GroupsMixin):
    """``instanceGroupManagerResizeRequests.*`` (insert, get, list, cancel, delete) and their life."""

    def _clear(self) -> None:
        super()._clear()
        self._resizes: dict[tuple[str, str, str, str], ResizeRequest] = {}

    def _awaiting(self, grp: Group) -> int:
        """VMs of the group's target size that its waiting resize requests will create (not the group)."""
        return sum(
            r.resize_by
            for r in self._resizes.values()
            if (r.project, r.zone, r.group) == (grp.project, grp.zone, grp.name) and r.state in State.WAITING
        )

    def _rr(self, project: str, zone: str, group: str, name: str) -> ResizeRequest:
        self._get(GROUPS, project, zone, group)
        rr = self._resizes.get((project, zone, group, name))
        if rr is None:
            raise cexc.not_found(f"{GROUPS.path(project, zone, group)}/resizeRequests/{name}")
        return rr

    def _rr_json(self, rr: ResizeRequest) -> dict[str, Any]:
        base = self.link_base
        status: dict[str, Any] = {}
        if rr.error is not None:
            status["error"] = rr.error
        if rr.last_error is not None:
            status["lastAttempt"] = {"error": rr.last_error}
        out: dict[str, Any] = {
            "kind": "compute#instanceGroupManagerResizeRequest",
            "id": str(rr.uid),
            "creationTimestamp": timestamp(rr.create_time),
            "name": rr.name,
            "zone": f"{base}projects/{rr.project}/zones/{rr.zone}",
            "resizeBy": rr.resize_by,
            "state": rr.state,
            "status": status,
            "selfLink": base + rr.path,
            "selfLinkWithId": f"{base}{GROUPS.path(rr.project, rr.zone, rr.group)}/resizeRequests/{rr.uid}",
        }
        if rr.run_s is not None:
            out["requestedRunDuration"] = {"seconds": str(int(rr.run_s))}
        if rr.description:
            out["description"] = rr.description
        return out

    # -- the API ---------------------------------------------------------------------------------
    def insert_resize_request(
        self, project: str, zone: str, group: str, body: dict[str, Any], request_id: str | None = None
    ) -> dict[str, Any]:
        def run() -> dict[str, Any]:
            grp = self._get(GROUPS, project, zone, group)
            name = check_name(body.get("name"), "resource.name")
            if (project, zone, group, name) in self._resizes:
                raise cexc.already_exists(f"{grp.path}/resizeRequests/{name}")
            if body.get("instances"):
                raise cexc.Invalid("Invalid value for field 'resource.instances': this fake serves resizeBy only")
            by = body.get("resizeBy")
            if isinstance(by, str) and by.isdigit():
                by = int(by)
            if not isinstance(by, int) or isinstance(by, bool) or by < 1:
                raise cexc.Invalid(f"Invalid value for field 'resource.resizeBy': {body.get('resizeBy')!r}. "
                                   "Must be a positive integer.")  # fmt: skip
            # Optional here: gcloud's help says so for groups that consume a reservation or use FLEX_START
            # (the only ones that take resize requests).
            run_s = None
            if body.get("requestedRunDuration"):
                run_s = seconds(body["requestedRunDuration"], "resource.requestedRunDuration")
            if run_s is not None and not MIN_RUN_S <= run_s <= MAX_RUN_S:
                raise cexc.Invalid(
                    f"Invalid value for field 'resource.requestedRunDuration': '{int(run_s)}s'. The requested run "
                    "duration must be between 10 minutes (600s) and 7 days (604800s)."
                )
            props = dict(grp.template.body.get("properties") or {})
            if not model_ok(props):
                self._bad_model(props)
            # Only the machine type now: a calendar reservation a request names may not exist yet.
            machine = self._machine(props.get("machineType"), "instanceTemplate.properties.machineType")
            topo = (grp.policy.body.get("workloadPolicy") or {}).get("acceleratorTopology") if grp.policy else None
            if topo:
                chips = 1
                for d in str(topo).split("x"):
                    chips *= int(d)
                if chips != (grp.target_size + by) * machine.chips:
                    raise cexc.Invalid(
                        f"Invalid value for field 'resource.resizeBy': {by}. acceleratorTopology {topo} needs "
                        f"{chips // machine.chips} VMs of {machine.name} in the group ({grp.target_size} already)."
                    )
            now = self.clock.now()
            # Google's operation names the group (gcloud appends resizeRequests/<name> to its targetLink).
            op = self._new_op(project, f"zones/{zone}", "insert", grp.path, grp.uid)
            rr = ResizeRequest(project, zone, group, name, next(self._uids), by, run_s,
                               str(body.get("description") or ""), now, op)  # fmt: skip
            grp.body["targetSize"] = grp.target_size + by  # Google: the target size grows on CREATING
            self._resizes[(project, zone, group, name)] = rr
            return op.to_json(self.link_base)

        path = f"{API}{GROUPS.path(project, zone, group)}/resizeRequests"
        return self._call("POST", path, self._once(request_id, run))

    def _bad_model(self, props: dict[str, Any]) -> None:
        model = (props.get("scheduling") or {}).get("provisioningModel") or "STANDARD"
        raise cexc.Invalid(
            f"Invalid value for field 'resource': resize requests need an instance template whose provisioning "
            f"model is FLEX_START or RESERVATION_BOUND; the group's template uses {model}."
        )

    def get_resize_request(self, project: str, zone: str, group: str, name: str) -> dict[str, Any]:
        path = f"{API}{GROUPS.path(project, zone, group)}/resizeRequests/{name}"
        return self._call("GET", path, lambda: self._rr_json(self._rr(project, zone, group, name)))

    def list_resize_requests(
        self, project: str, zone: str, group: str, flt: str | None = None, max_results: int | None = None,
        token: str | None = None,
    ) -> dict[str, Any]:  # fmt: skip
        def run() -> dict[str, Any]:
            self._get(GROUPS, project, zone, group)
            recs = sorted((r for k, r in self._resizes.items() if k[:3] == (project, zone, group)),
                          key=lambda r: r.name)  # fmt: skip
            out = self._list("compute#instanceGroupManagerResizeRequestList", [self._rr_json(r) for r in recs],
                             flt, max_results, token)  # fmt: skip
            out["selfLink"] = f"{self.link_base}{GROUPS.path(project, zone, group)}/resizeRequests"
            return out

        return self._call("GET", f"{API}{GROUPS.path(project, zone, group)}/resizeRequests", run)

    def cancel_resize_request(
        self, project: str, zone: str, group: str, name: str, request_id: str | None = None
    ) -> dict[str, Any]:
        def run() -> dict[str, Any]:
            rr = self._rr(project, zone, group, name)
            if rr.state != State.ACCEPTED:
                raise exc.InvalidArgument(
                    f"The resize request '{rr.path}' is in state {rr.state}; only a request in state ACCEPTED can "
                    "be cancelled.", reason="resourceNotReady",
                )  # fmt: skip
            self._end(rr, State.CANCELLED)  # this operation names the request (gcloud reads it back from there)
            return self._done_op(project, f"zones/{zone}", "cancel", rr.path, rr.uid)

        path = f"{API}{GROUPS.path(project, zone, group)}/resizeRequests/{name}/cancel"
        return self._call("POST", path, self._once(request_id, run))

    def delete_resize_request(
        self, project: str, zone: str, group: str, name: str, request_id: str | None = None
    ) -> dict[str, Any]:
        def run() -> dict[str, Any]:
            rr = self._rr(project, zone, group, name)
            if rr.state not in State.TERMINAL:
                raise exc.InvalidArgument(
                    f"The resize request '{rr.path}' is in state {rr.state}; cancel it first: only a SUCCEEDED, "
                    "FAILED or CANCELLED request can be deleted.", reason="resourceNotReady",
                )  # fmt: skip
            del self._resizes[(project, zone, group, name)]  # its VMs, if any, stay in the group
            return self._done_op(project, f"zones/{zone}", "delete", rr.path, rr.uid)

        path = f"{API}{GROUPS.path(project, zone, group)}/resizeRequests/{name}"
        return self._call("DELETE", path, self._once(request_id, run))

    # -- time ------------------------------------------------------------------------------------
    def _end(self, rr: ResizeRequest, state: str, error: dict[str, Any] | None = None) -> None:
        """A waiting request ends without VMs: the group's target size shrinks back."""
        grp = self._groups.get((rr.project, rr.zone, rr.group))
        if grp is not None and rr.state in State.WAITING:
            grp.body["targetSize"] = max(0, grp.target_size - rr.resize_by)
        rr.state, rr.error = state, error
        rr.op.finish(self.clock.now())

    def _advance_resizes(self, now: float) -> bool:
        changed = False
        for key, rr in list(self._resizes.items()):
            grp = self._groups.get(key[:3])
            if grp is None:  # deleting the group removed its requests
                del self._resizes[key]
                changed = True
            elif rr.state == State.CREATING and now > rr.create_time:
                rr.state = State.ACCEPTED
                rr.op.finish(now)
                changed = True
            elif rr.state == State.ACCEPTED:
                changed |= self._try_create(rr, grp, now)
            elif rr.state == State.SUCCEEDED and not rr.expired:
                live = [i for n in rr.instances if (i := self._instances.get((rr.project, rr.zone, n)))]
                if (rr.run_until is not None and now >= rr.run_until) or not live:
                    rr.expired = True  # at the end of the run duration the MIG deletes the VMs
                    grp.body["targetSize"] = max(0, grp.target_size - rr.resize_by)
                    for inst in live:
                        if not inst.deleting:
                            self._start_delete(inst, "run-duration-ended")
                    changed = True
        return changed

    def _try_create(self, rr: ResizeRequest, grp: Group, now: float) -> bool:
        """Create all of the request's VMs if capacity allows; else wait (or fail)."""
        if grp.deleting:
            self._end(rr, State.CANCELLED)
            return True
        props = dict(grp.template.body.get("properties") or {})
        props.pop("name", None)
        if rr.run_s is not None:
            sched = {**(props.get("scheduling") or {}), "maxRunDuration": {"seconds": str(int(rr.run_s))},
                     "instanceTerminationAction": "DELETE"}  # fmt: skip
            props["scheduling"] = sched
        try:
            machine, model, reservation, _ = self._placement(rr.project, rr.zone, props)
        except exc.ApiError as e:
            err = _error("RESOURCE_NOT_FOUND" if isinstance(e, exc.NotFound) else (e.reason or e.status), e.message)
            if isinstance(e, exc.NotFound) and self._reservation_coming(rr.project, rr.zone, props, now):
                rr.last_error = err  # a calendar reservation's window has not opened yet
                return False
            self._end(rr, State.FAILED, err)
            return True
        short = self._shortfall(rr.project, rr.zone, machine, model, reservation, rr.resize_by)
        if short is not None:
            if short["errors"][0]["code"] == "QUOTA_EXCEEDED":
                self._end(rr, State.FAILED, short)
                return True
            rr.last_error = short  # the scheduler waits for capacity
            return False
        base = grp.body.get("baseInstanceName") or grp.name
        for _ in range(rr.resize_by):
            name = f"{base}-{secrets.token_hex(2)}"
            while (grp.project, grp.zone, name) in self._instances:
                name = f"{base}-{secrets.token_hex(2)}"
            md = dict(props.get("metadata") or {})
            md["items"] = [*(md.get("items") or []), {"key": "created-by", "value": grp.path},
                           {"key": "instance-template", "value": grp.template.path}]  # fmt: skip
            inst = self._new_instance(grp.project, grp.zone, {**props, "name": name, "metadata": md}, group=grp.name)
            inst.status, inst.ready_at = Status.PROVISIONING, now + self.latency.provision_s
            self._instances[(inst.project, inst.zone, inst.name)] = inst
            grp.instances.append(inst.name)
            rr.instances.append(inst.name)
        rr.state, rr.last_error = State.SUCCEEDED, None
        if rr.run_s is not None:
            rr.run_until = now + self.latency.provision_s + rr.run_s
        return True

    def _reservation_coming(self, project: str, zone: str, props: dict[str, Any], now: float) -> bool:
        """Whether a future reservation will create, after ``now``, the reservation ``props`` targets (futures
        override)."""
        return False


def model_ok(props: dict[str, Any]) -> bool:
    return (props.get("scheduling") or {}).get("provisioningModel") in MODELS
