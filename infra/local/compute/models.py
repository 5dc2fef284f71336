"""The fake Compute Engine as a thread-safe state machine, usable without HTTP.

Every public API method mirrors one REST method (JSON in and out, resources by project/zone/name)
and checks injected faults against the REST path it stands for. Time comes from a clock
(``ManualClock`` in tests); state advances on every call and on ``tick()``.

Instance: PROVISIONING -> RUNNING (after ``provision_s``); delete: STOPPING -> gone (after
``delete_s``); spot preemption: STOPPING (the guest gets SIGTERM) -> ``preempt_notice_s`` of fake
time later TERMINATED (or deleted, per ``instanceTerminationAction``), with a
``compute.instances.preempted`` zone operation. A FLEX_START instance without capacity waits
PENDING for up to ``params.requestValidForDuration``. An insert without capacity (per zone and
provisioning model, or reservation count, or regional quota) ends in an operation error
(``ZONE_RESOURCE_POOL_EXHAUSTED`` / ``QUOTA_EXCEEDED``) and leaves no instance.
Managed instance group with ``targetSizePolicy.mode: BULK``: its insert operation ends at once; it
creates no VM until all ``targetSize`` can be created (until then ``status.bulkInstanceOperation``
carries the error), then creates them together. Listeners get ``NodeEvent``s for the host
simulator: ``ready`` when a slice (an instance, or all of a group's) is RUNNING, ``terminating``
(SIGTERM) and ``stopped`` (kill).
"""

from __future__ import annotations

import itertools
import re
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from infra.local.compute import exceptions as cexc
from infra.local.compute.capacity import MODELS, Capacity
from infra.local.compute.filters import compile_filter
from infra.local.compute.machines import MACHINE_TYPES, MachineType
from infra.local.compute.records import (
    OUTPUT_ONLY,
    Group,
    Instance,
    Operation,
    Policy,
    Status,
    Template,
    region_of,
    timestamp,
)
from infra.local.core import exceptions as exc
from infra.local.core.backend import FakeBackend, NodeEvent, operation_id, page
from infra.local.core.clock import Clock

GOOGLE_BASE = "https://compute.googleapis.com/compute/v1/"
NAME_RE = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
PROVISIONING_MODELS = (*MODELS, "RESERVATION_BOUND")
RESERVATION_KEY = "compute.googleapis.com/reservation-name"
PREEMPTED = "compute.instances.preempted"
_TOPOLOGY_RE = re.compile(r"^\d+(x\d+){1,2}$")


@dataclass
class Latency:
    provision_s: float = 0.0  # PROVISIONING -> RUNNING
    delete_s: float = 0.0  # STOPPING -> gone


def _seconds(d: Any, field: str) -> float:
    """A Compute Engine ``Duration`` (``{"seconds": "3600", "nanos": 0}``) in seconds."""
    if not isinstance(d, dict) or "seconds" not in d:
        raise cexc.Invalid(f"Invalid value for field '{field}': {d!r}; expected {{seconds}}")
    return float(d["seconds"]) + float(d.get("nanos") or 0) / 1e9


def _last(link: str) -> str:
    return link.rstrip("/").rsplit("/", 1)[-1]


def _check_name(name: Any, what: str) -> str:
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise cexc.Invalid(
            f"Invalid value for field '{what}': {name!r}. Must be a match of regex '(?:[a-z](?:[-a-z0-9]{{0,61}}"
            "[a-z0-9])?)'",
        )
    return name


class ComputeBackend(FakeBackend[NodeEvent]):
    """All projects and zones of the fake service. Thread-safe; see the module docstring."""

    def __init__(
        self,
        *,
        clock: Clock | None = None,
        latency: Latency | None = None,
        preempt_notice_s: float = 30.0,
        link_base: str = GOOGLE_BASE,
    ) -> None:
        super().__init__(clock=clock)
        self._initial = (latency or Latency(), preempt_notice_s)
        self.latency = Latency(**vars(self._initial[0]))
        self.preempt_notice_s = preempt_notice_s
        self.link_base = link_base  # the server sets its own URL: links never point off loopback
        self.wait_s = 2.0  # longest an operations.wait call holds (wall seconds)
        self.capacity = Capacity()
        self._uids = itertools.count(4_000_000_000_000_000_001)
        self._ips = itertools.count(0)
        self._clear()

    def _clear(self) -> None:
        self._instances: dict[tuple[str, str, str], Instance] = {}
        self._templates: dict[tuple[str, str, str], Template] = {}
        self._policies: dict[tuple[str, str, str], Policy] = {}
        self._groups: dict[tuple[str, str, str], Group] = {}
        self._ops: dict[tuple[str, str, str], Operation] = {}
        self._failures: dict[str, dict[str, Any]] = {}  # instance path -> why its insert failed
        self._hosted: set[tuple[str, int]] = set()  # (instance path, uid) whose host runs
        self._guest: dict[tuple[str, str, str], str] = {}  # (instance path, namespace, key) -> value
        self._requests: dict[str, tuple[str, str, str]] = {}  # requestId -> its operation's key

    # -- small helpers -------------------------------------------------------------------------
    def _once(self, request_id: str | None, run: Callable[[], dict[str, Any]]) -> Callable[[], dict[str, Any]]:
        """``requestId``: a retried request returns the first one's operation and does nothing again."""

        def wrapped() -> dict[str, Any]:
            if request_id and request_id in self._requests:
                return self._ops[self._requests[request_id]].to_json(self.link_base)
            out = run()
            if request_id:
                parts = str(out["selfLink"]).removeprefix(self.link_base).split("/")
                self._requests[request_id] = (parts[1], "/".join(parts[2:-2]), parts[-1])
            return out

        return wrapped

    def _new_op(self, project: str, scope: str, op_type: str, target: str, target_id: int) -> Operation:
        now = self.clock.now()
        op = Operation(project, scope, operation_id(now), next(self._uids), op_type, target, target_id, now)
        self._ops[(project, scope, op.name)] = op
        return op

    def _done_op(self, project: str, scope: str, op_type: str, target: str, target_id: int) -> dict[str, Any]:
        op = self._new_op(project, scope, op_type, target, target_id)
        op.finish(self.clock.now())
        return op.to_json(self.link_base)

    def _list(
        self, kind: str, items: list[dict[str, Any]], flt: str | None, max_results: int | None, token: str | None
    ) -> dict[str, Any]:
        pred = compile_filter(flt)
        chunk, nxt = page([i for i in items if pred(i)], max_results, token)
        out: dict[str, Any] = {"kind": kind, "id": kind}
        if chunk:
            out["items"] = chunk
        if nxt:
            out["nextPageToken"] = nxt
        return out

    # -- capacity --------------------------------------------------------------------------------
    def _holding(self) -> list[Instance]:
        return [i for i in self._instances.values() if i.status in Status.HOLDS_CAPACITY]

    def _shortfall(
        self, project: str, zone: str, machine: MachineType, model: str, reservation: str, count: int
    ) -> dict[str, Any] | None:
        """The operation error if ``count`` VMs cannot be placed now, else None."""
        zc = self.capacity.zone(zone)
        if model == "RESERVATION_BOUND":
            res = zc.reservations.get(reservation)
            used = sum(1 for i in self._holding() if i.zone == zone and i.reservation == reservation)
            ok = res is not None and res.count - used >= count
        else:
            used = sum(i.machine.chips for i in self._holding() if i.zone == zone and i.model == model)
            ok = zc.chips[model] - used >= machine.chips * count
        if not ok:
            return cexc.zone_exhausted(project, zone, machine.name, model)
        region = region_of(zone)
        metric = ("PREEMPTIBLE_" if model == "SPOT" else "") + machine.quota_metric
        limit = self.capacity.quota(region, metric)
        usage = self._quota_usage(region, metric)
        if usage + machine.chips * count > limit:
            return cexc.quota_exceeded(metric, limit, region)
        return None

    def _quota_usage(self, region: str, metric: str) -> int:
        return sum(
            i.machine.chips
            for i in self._holding()
            if region_of(i.zone) == region
            and ("PREEMPTIBLE_" if i.model == "SPOT" else "") + i.machine.quota_metric == metric
        )

    # -- instances ---------------------------------------------------------------------------------
    def _machine(self, value: Any, field: str) -> MachineType:
        name = _last(str(value or ""))
        if name not in MACHINE_TYPES:
            raise cexc.Invalid(
                f"Invalid value for field '{field}': {value!r}. Machine type {name!r} is not a TPU machine type "
                f"this fake serves ({', '.join(sorted(MACHINE_TYPES))})",
            )
        return MACHINE_TYPES[name]

    def _new_instance(self, project: str, zone: str, body: dict[str, Any], group: str = "") -> Instance:
        """Validate an instance body and build the record (not stored)."""
        name = _check_name(body.get("name"), "resource.name")
        if (project, zone, name) in self._instances:
            raise cexc.already_exists(f"projects/{project}/zones/{zone}/instances/{name}")
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

    def _placement(self, project: str, zone: str, body: dict[str, Any]) -> tuple[MachineType, str, str, float | None]:
        """(machine type, provisioning model, reservation, maxRunDuration s) of a valid instance body."""
        machine = self._machine(body.get("machineType"), "resource.machineType")
        sched = body.get("scheduling") or {}
        model = str(sched.get("provisioningModel") or ("SPOT" if sched.get("preemptible") else "STANDARD"))
        if model not in PROVISIONING_MODELS:
            raise cexc.Invalid(
                f"Invalid value for field 'resource.scheduling.provisioningModel': {model!r}; "
                f"allowed: {', '.join(PROVISIONING_MODELS)}"
            )
        action = sched.get("instanceTerminationAction")
        if action not in (None, "STOP", "DELETE"):
            raise cexc.Invalid(
                f"Invalid value for field 'resource.scheduling.instanceTerminationAction': {action!r}; "
                "allowed: STOP, DELETE"
            )
        if sched.get("onHostMaintenance") not in (None, "TERMINATE"):
            raise cexc.Invalid(
                "Invalid value for field 'resource.scheduling.onHostMaintenance': TPU VMs must use TERMINATE"
            )
        run_s = _seconds(sched["maxRunDuration"], "resource.scheduling.maxRunDuration") if sched.get(
            "maxRunDuration") else None  # fmt: skip
        if model == "FLEX_START" and run_s is None:
            raise cexc.Invalid(
                "Invalid value for field 'resource.scheduling.maxRunDuration': FLEX_START needs a maxRunDuration"
            )
        reservation = ""
        affinity = body.get("reservationAffinity") or {}
        if model == "RESERVATION_BOUND":
            values = affinity.get("values") or []
            if affinity.get("consumeReservationType") != "SPECIFIC_RESERVATION" or affinity.get(
                "key") != RESERVATION_KEY or len(values) != 1:  # fmt: skip
                raise cexc.Invalid(
                    "Invalid value for field 'resource.reservationAffinity': RESERVATION_BOUND needs "
                    f"{{consumeReservationType: SPECIFIC_RESERVATION, key: {RESERVATION_KEY}, values: [<name>]}}"
                )
            reservation = _last(str(values[0]))
            res = self.capacity.zone(zone).reservations.get(reservation)
            if res is None:
                raise cexc.not_found(f"projects/{project}/zones/{zone}/reservations/{reservation}")
            if res.machine_type != machine.name:
                raise cexc.Invalid(f"Reservation {reservation} is for {res.machine_type}, not {machine.name}")
        return machine, model, reservation, run_s

    def _place(self, inst: Instance, op: Operation | None) -> None:
        """Store ``inst`` if capacity allows (or, FLEX_START, wait); else fail ``op``."""
        now = self.clock.now()
        err = self._shortfall(inst.project, inst.zone, inst.machine, inst.model, inst.reservation, 1)
        if err is None:
            inst.status, inst.ready_at = Status.PROVISIONING, now + self.latency.provision_s
        elif inst.model == "FLEX_START" and (inst.body.get("params") or {}).get("requestValidForDuration"):
            wait = _seconds(inst.body["params"]["requestValidForDuration"], "resource.params.requestValidForDuration")
            inst.status, inst.wait_until = Status.PENDING, now + wait
        else:
            if op is not None:
                op.finish(now, err)
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

        return self._call("POST", f"/compute/v1/projects/{project}/zones/{zone}/instances", self._once(request_id, run))

    def _instance(self, project: str, zone: str, name: str) -> Instance:
        inst = self._instances.get((project, zone, name))
        if inst is None:
            raise cexc.not_found(f"projects/{project}/zones/{zone}/instances/{name}")
        return inst

    def get_instance(self, project: str, zone: str, name: str) -> dict[str, Any]:
        path = f"/compute/v1/projects/{project}/zones/{zone}/instances/{name}"
        return self._call("GET", path, lambda: self._instance(project, zone, name).to_json(self.link_base))

    def list_instances(
        self, project: str, zone: str, flt: str | None = None, max_results: int | None = None, token: str | None = None
    ) -> dict[str, Any]:
        def run() -> dict[str, Any]:
            items = [i.to_json(self.link_base) for (p, z, _), i in sorted(self._instances.items())
                     if p == project and z == zone]  # fmt: skip
            return self._list("compute#instanceList", items, flt, max_results, token)

        return self._call("GET", f"/compute/v1/projects/{project}/zones/{zone}/instances", run)

    def _start_delete(self, inst: Instance, reason: str) -> None:
        now = self.clock.now()
        if inst.status in (Status.PENDING, Status.TERMINATED):
            del self._instances[(inst.project, inst.zone, inst.name)]
            return
        inst.deleting, inst.status, inst.gone_at = True, Status.STOPPING, now + self.latency.delete_s
        self._stop_host(inst, reason)

    def delete_instance(self, project: str, zone: str, name: str, request_id: str | None = None) -> dict[str, Any]:
        def run() -> dict[str, Any]:
            inst = self._instance(project, zone, name)  # a group's member: the group creates a new one
            op = self._new_op(project, f"zones/{zone}", "delete", inst.path, inst.uid)
            if not inst.deleting:
                self._start_delete(inst, "deleted")
            return op.to_json(self.link_base)

        return self._call(
            "DELETE", f"/compute/v1/projects/{project}/zones/{zone}/instances/{name}", self._once(request_id, run)
        )

    # -- templates and policies -------------------------------------------------------------------
    def insert_template(
        self, project: str, region: str, body: dict[str, Any], request_id: str | None = None
    ) -> dict[str, Any]:
        """``region`` "" = a global template."""
        scope = f"regions/{region}" if region else "global"

        def run() -> dict[str, Any]:
            name = _check_name(body.get("name"), "resource.name")
            if (project, region, name) in self._templates:
                raise cexc.already_exists(f"projects/{project}/{scope}/instanceTemplates/{name}")
            props = body.get("properties") or {}
            self._machine(props.get("machineType"), "resource.properties.machineType")
            tpl = Template(project, region, name, next(self._uids), dict(body), self.clock.now())
            self._templates[(project, region, name)] = tpl
            return self._done_op(project, scope, "insert", tpl.path, tpl.uid)

        return self._call(
            "POST", f"/compute/v1/projects/{project}/{scope}/instanceTemplates", self._once(request_id, run)
        )

    def _template(self, project: str, region: str, name: str) -> Template:
        tpl = self._templates.get((project, region, name))
        if tpl is None:
            scope = f"regions/{region}" if region else "global"
            raise cexc.not_found(f"projects/{project}/{scope}/instanceTemplates/{name}")
        return tpl

    def get_template(self, project: str, region: str, name: str) -> dict[str, Any]:
        scope = f"regions/{region}" if region else "global"
        path = f"/compute/v1/projects/{project}/{scope}/instanceTemplates/{name}"
        return self._call("GET", path, lambda: self._template(project, region, name).to_json(self.link_base))

    def list_templates(
        self,
        project: str,
        region: str,
        flt: str | None = None,
        max_results: int | None = None,
        token: str | None = None,
    ) -> dict[str, Any]:
        scope = f"regions/{region}" if region else "global"

        def run() -> dict[str, Any]:
            items = [t.to_json(self.link_base) for (p, r, _), t in sorted(self._templates.items())
                     if p == project and r == region]  # fmt: skip
            return self._list("compute#instanceTemplateList", items, flt, max_results, token)

        return self._call("GET", f"/compute/v1/projects/{project}/{scope}/instanceTemplates", run)

    def _in_use(self, what: str, path: str, users: list[Group]) -> None:
        if users:
            raise cexc.in_use(what, path, users[0].path)

    def delete_template(self, project: str, region: str, name: str, request_id: str | None = None) -> dict[str, Any]:
        scope = f"regions/{region}" if region else "global"

        def run() -> dict[str, Any]:
            tpl = self._template(project, region, name)
            self._in_use("instance_template", tpl.path, [g for g in self._groups.values() if g.template is tpl])
            del self._templates[(project, region, name)]
            return self._done_op(project, scope, "delete", tpl.path, tpl.uid)

        return self._call(
            "DELETE", f"/compute/v1/projects/{project}/{scope}/instanceTemplates/{name}", self._once(request_id, run)
        )

    def insert_policy(
        self, project: str, region: str, body: dict[str, Any], request_id: str | None = None
    ) -> dict[str, Any]:
        def run() -> dict[str, Any]:
            name = _check_name(body.get("name"), "resource.name")
            if (project, region, name) in self._policies:
                raise cexc.already_exists(f"projects/{project}/regions/{region}/resourcePolicies/{name}")
            wp = body.get("workloadPolicy")
            if wp is not None:
                if wp.get("type") not in ("HIGH_THROUGHPUT", "HIGH_AVAILABILITY"):
                    raise cexc.Invalid(
                        f"Invalid value for field 'resource.workloadPolicy.type': {wp.get('type')!r}; "
                        "allowed: HIGH_THROUGHPUT, HIGH_AVAILABILITY"
                    )
                topo = wp.get("acceleratorTopology")
                if topo is not None and not _TOPOLOGY_RE.match(str(topo)):
                    raise cexc.Invalid(
                        f"Invalid value for field 'resource.workloadPolicy.acceleratorTopology': {topo!r} "
                        "(expected e.g. 2x2x4 or 8x8)"
                    )
            pol = Policy(project, region, name, next(self._uids), dict(body), self.clock.now())
            self._policies[(project, region, name)] = pol
            return self._done_op(project, f"regions/{region}", "insert", pol.path, pol.uid)

        return self._call(
            "POST", f"/compute/v1/projects/{project}/regions/{region}/resourcePolicies", self._once(request_id, run)
        )

    def _policy(self, project: str, region: str, name: str) -> Policy:
        pol = self._policies.get((project, region, name))
        if pol is None:
            raise cexc.not_found(f"projects/{project}/regions/{region}/resourcePolicies/{name}")
        return pol

    def get_policy(self, project: str, region: str, name: str) -> dict[str, Any]:
        path = f"/compute/v1/projects/{project}/regions/{region}/resourcePolicies/{name}"
        return self._call("GET", path, lambda: self._policy(project, region, name).to_json(self.link_base))

    def list_policies(
        self,
        project: str,
        region: str,
        flt: str | None = None,
        max_results: int | None = None,
        token: str | None = None,
    ) -> dict[str, Any]:
        def run() -> dict[str, Any]:
            items = [t.to_json(self.link_base) for (p, r, _), t in sorted(self._policies.items())
                     if p == project and r == region]  # fmt: skip
            return self._list("compute#resourcePolicyList", items, flt, max_results, token)

        return self._call("GET", f"/compute/v1/projects/{project}/regions/{region}/resourcePolicies", run)

    def delete_policy(self, project: str, region: str, name: str, request_id: str | None = None) -> dict[str, Any]:
        def run() -> dict[str, Any]:
            pol = self._policy(project, region, name)
            self._in_use("resource_policy", pol.path, [g for g in self._groups.values() if g.policy is pol])
            del self._policies[(project, region, name)]
            return self._done_op(project, f"regions/{region}", "delete", pol.path, pol.uid)

        return self._call(
            "DELETE",
            f"/compute/v1/projects/{project}/regions/{region}/resourcePolicies/{name}",
            self._once(request_id, run),
        )

    # -- managed instance groups ------------------------------------------------------------------
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
        def run() -> dict[str, Any]:
            name = _check_name(body.get("name"), "resource.name")
            if (project, zone, name) in self._groups:
                raise cexc.already_exists(f"projects/{project}/zones/{zone}/instanceGroupManagers/{name}")
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
            grp = Group(project, zone, name, next(self._uids), kept, tpl, policy, self.clock.now())
            self._groups[(project, zone, name)] = grp
            # BULK: the insert ends before any VM exists; the group creates them as capacity allows.
            return self._done_op(project, f"zones/{zone}", "insert", grp.path, grp.uid)

        return self._call(
            "POST", f"/compute/v1/projects/{project}/zones/{zone}/instanceGroupManagers", self._once(request_id, run)
        )

    def _group(self, project: str, zone: str, name: str) -> Group:
        grp = self._groups.get((project, zone, name))
        if grp is None:
            raise cexc.not_found(f"projects/{project}/zones/{zone}/instanceGroupManagers/{name}")
        return grp

    def _members(self, grp: Group) -> list[Instance]:
        found = (self._instances.get((grp.project, grp.zone, n)) for n in grp.instances)
        return [i for i in found if i is not None]

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

    def get_group(self, project: str, zone: str, name: str) -> dict[str, Any]:
        path = f"/compute/v1/projects/{project}/zones/{zone}/instanceGroupManagers/{name}"
        return self._call("GET", path, lambda: self._group_json(self._group(project, zone, name)))

    def list_groups(
        self, project: str, zone: str, flt: str | None = None, max_results: int | None = None, token: str | None = None
    ) -> dict[str, Any]:
        def run() -> dict[str, Any]:
            items = [self._group_json(g) for (p, z, _), g in sorted(self._groups.items()) if p == project and z == zone]
            return self._list("compute#instanceGroupManagerList", items, flt, max_results, token)

        return self._call("GET", f"/compute/v1/projects/{project}/zones/{zone}/instanceGroupManagers", run)

    def list_managed_instances(
        self, project: str, zone: str, name: str, max_results: int | None = None, token: str | None = None
    ) -> dict[str, Any]:
        def run() -> dict[str, Any]:
            grp = self._group(project, zone, name)
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
            chunk, nxt = page(items, max_results, token)
            out: dict[str, Any] = {"managedInstances": chunk} if chunk else {}
            if nxt:
                out["nextPageToken"] = nxt
            return out

        path = f"/compute/v1/projects/{project}/zones/{zone}/instanceGroupManagers/{name}/listManagedInstances"
        return self._call("POST", path, run)

    def delete_group(self, project: str, zone: str, name: str, request_id: str | None = None) -> dict[str, Any]:
        def run() -> dict[str, Any]:
            grp = self._group(project, zone, name)
            op = self._new_op(project, f"zones/{zone}", "delete", grp.path, grp.uid)
            grp.deleting = True
            for inst in self._members(grp):
                if not inst.deleting:
                    self._start_delete(inst, "deleted")
            return op.to_json(self.link_base)

        return self._call(
            "DELETE",
            f"/compute/v1/projects/{project}/zones/{zone}/instanceGroupManagers/{name}",
            self._once(request_id, run),
        )

    def _grow(self, grp: Group, now: float) -> bool:
        """Create the group's missing VMs: all at once under BULK (or none), else as many as fit."""
        missing = grp.target_size - len(self._members(grp))
        if grp.deleting or missing <= 0:
            return False
        props = dict(grp.template.body.get("properties") or {})
        props.pop("name", None)
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
        base = grp.body.get("baseInstanceName") or grp.name
        for _ in range(count):
            name = f"{base}-{secrets.token_hex(2)}"
            while (grp.project, grp.zone, name) in self._instances:
                name = f"{base}-{secrets.token_hex(2)}"
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

    # -- operations -----------------------------------------------------------------------------
    def _op(self, project: str, scope: str, name: str) -> Operation:
        op = self._ops.get((project, scope, name))
        if op is None:
            raise cexc.not_found(f"projects/{project}/{scope}/operations/{name}")
        return op

    def get_operation(self, project: str, scope: str, name: str) -> dict[str, Any]:
        """``scope``: ``zones/<zone>``, ``regions/<region>`` or ``global``."""
        path = f"/compute/v1/projects/{project}/{scope}/operations/{name}"
        return self._call("GET", path, lambda: self._op(project, scope, name).to_json(self.link_base))

    def wait_operation(self, project: str, scope: str, name: str, timeout_s: float | None = None) -> dict[str, Any]:
        """Like Google's ``wait``: returns when DONE or after a while (theirs: ~2 min; here ``wait_s``
        of wall time, so a test on a manual clock is never stuck); the caller polls again if not DONE."""
        path = f"/compute/v1/projects/{project}/{scope}/operations/{name}"
        deadline = time.monotonic() + (self.wait_s if timeout_s is None else timeout_s)
        while True:
            op = self._call("POST", path + "/wait", lambda: self._op(project, scope, name).to_json(self.link_base))
            if op["status"] == "DONE" or time.monotonic() >= deadline:
                return op
            threading.Event().wait(0.02)

    def list_operations(
        self, project: str, scope: str, flt: str | None = None, max_results: int | None = None, token: str | None = None
    ) -> dict[str, Any]:
        def run() -> dict[str, Any]:
            ops = sorted((o for (p, s, _), o in self._ops.items() if p == project and s == scope),
                         key=lambda o: (o.insert_time, o.uid))  # fmt: skip
            return self._list("compute#operationList", [o.to_json(self.link_base) for o in ops], flt, max_results,
                              token)  # fmt: skip

        return self._call("GET", f"/compute/v1/projects/{project}/{scope}/operations", run)

    def _settle_ops(self, now: float) -> None:
        for op in self._ops.values():
            if op.done or op.op_type == PREEMPTED:
                continue
            parts = op.target.split("/")
            collection, zone, name = parts[-2], parts[3], parts[-1]
            if collection == "instances":
                inst = self._instances.get((op.project, zone, name))
                if op.op_type == "insert":
                    if inst is None or inst.uid != op.target_id:
                        gone = {"code": "RESOURCE_NOT_FOUND", "message": f"The instance '{op.target}' was deleted"}
                        op.finish(now, self._failures.get(op.target) or {"errors": [gone]})
                    elif inst.status == Status.RUNNING:
                        op.finish(now)
                elif op.op_type == "delete" and inst is None:
                    op.finish(now)
            elif (
                collection == "instanceGroupManagers"
                and op.op_type == "delete"
                and ((op.project, zone, name) not in self._groups)
            ):
                op.finish(now)

    # -- the time-driven state machine ------------------------------------------------------------
    def _advance(self) -> None:
        now = self.clock.now()
        for _ in range(6):  # zero latency settles create -> running -> ready in one call
            changed = self._advance_instances(now)
            for grp in list(self._groups.values()):
                changed |= self._advance_group(grp, now)
            changed |= self._start_hosts()
            if not changed:
                break
        self._settle_ops(now)

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

    # -- simulated hosts --------------------------------------------------------------------------
    def _slice(self, inst: Instance) -> list[Instance] | None:
        """The hosts of ``inst``'s slice, in rank order, once all are RUNNING; else None."""
        if not inst.group:
            return [inst] if inst.status == Status.RUNNING else None
        grp = self._groups.get((inst.project, inst.zone, inst.group))
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
        grp = self._groups.get((inst.project, inst.zone, inst.group)) if inst.group else None
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

    # -- aggregated lists (every zone / region of a project: what a reaper walks) -----------------
    _AGGREGATED = {
        "instances": "compute#instanceAggregatedList",
        "instanceGroupManagers": "compute#instanceGroupManagerAggregatedList",
        "resourcePolicies": "compute#resourcePolicyAggregatedList",
        "instanceTemplates": "compute#instanceTemplateAggregatedList",
    }

    def aggregated_list(self, project: str, collection: str, flt: str | None = None) -> dict[str, Any]:
        """``{items: {"zones/<z>"|"regions/<r>"|"global": {<collection>: [...]}}}``; scopes with no match
        are left out; one page (the fake holds few resources)."""
        if collection not in self._AGGREGATED:
            raise exc.NotFound(f"no aggregated list of {collection!r}")

        def run() -> dict[str, Any]:
            pred = compile_filter(flt)
            scoped: list[tuple[str, dict[str, Any]]] = []
            if collection == "instances":
                scoped = [(f"zones/{i.zone}", i.to_json(self.link_base)) for i in self._instances.values()
                          if i.project == project]  # fmt: skip
            elif collection == "instanceGroupManagers":
                scoped = [
                    (f"zones/{g.zone}", self._group_json(g)) for g in self._groups.values() if g.project == project
                ]
            elif collection == "resourcePolicies":
                scoped = [(f"regions/{p.region}", p.to_json(self.link_base)) for p in self._policies.values()
                          if p.project == project]  # fmt: skip
            else:
                scoped = [(f"regions/{t.region}" if t.region else "global", t.to_json(self.link_base))
                          for t in self._templates.values() if t.project == project]  # fmt: skip
            items: dict[str, dict[str, list[dict[str, Any]]]] = {}
            for scope, res in sorted(scoped, key=lambda sr: (sr[0], sr[1]["name"])):
                if pred(res):
                    items.setdefault(scope, {collection: []})[collection].append(res)
            kind = self._AGGREGATED[collection]
            return {"kind": kind, "id": kind, "items": items}

        return self._call("GET", f"/compute/v1/projects/{project}/aggregated/{collection}", run)

    # -- reservations, regions, machine types ---------------------------------------------------
    def _reservation_json(self, project: str, zone: str, name: str) -> dict[str, Any]:
        res = self.capacity.zone(zone).reservations.get(name)
        path = f"projects/{project}/zones/{zone}/reservations/{name}"
        if res is None:
            raise cexc.not_found(path)
        used = sum(1 for i in self._holding() if i.zone == zone and i.reservation == name)
        return {
            "kind": "compute#reservation",
            "id": str(abs(hash((zone, name))) % 10**18),
            "name": name,
            "zone": f"{self.link_base}projects/{project}/zones/{zone}",
            "selfLink": self.link_base + path,
            "status": "READY",
            "specificReservationRequired": True,
            "specificReservation": {
                "count": str(res.count),
                "inUseCount": str(used),
                "instanceProperties": {"machineType": res.machine_type},
            },
        }

    def get_reservation(self, project: str, zone: str, name: str) -> dict[str, Any]:
        path = f"/compute/v1/projects/{project}/zones/{zone}/reservations/{name}"
        return self._call("GET", path, lambda: self._reservation_json(project, zone, name))

    def list_reservations(
        self, project: str, zone: str, flt: str | None = None, max_results: int | None = None, token: str | None = None
    ) -> dict[str, Any]:
        def run() -> dict[str, Any]:
            names = sorted(self.capacity.zone(zone).reservations)
            items = [self._reservation_json(project, zone, n) for n in names]
            return self._list("compute#reservationList", items, flt, max_results, token)

        return self._call("GET", f"/compute/v1/projects/{project}/zones/{zone}/reservations", run)

    def get_region(self, project: str, region: str) -> dict[str, Any]:
        def run() -> dict[str, Any]:
            if not re.match(r"^[a-z]+-[a-z]+\d+$", region):
                raise cexc.not_found(f"projects/{project}/regions/{region}")
            quotas = []
            for gen in sorted({m.quota_metric for m in MACHINE_TYPES.values()}):
                for metric in (gen, "PREEMPTIBLE_" + gen):
                    quotas.append({"metric": metric, "limit": float(self.capacity.quota(region, metric)),
                                   "usage": float(self._quota_usage(region, metric))})  # fmt: skip
            zones = sorted(
                {*(f"{region}-{s}" for s in "abc"), *(z for z in self.capacity.zones if region_of(z) == region)}
            )
            return {
                "kind": "compute#region",
                "id": str(abs(hash(region)) % 10**12),
                "name": region,
                "selfLink": f"{self.link_base}projects/{project}/regions/{region}",
                "status": "UP",
                "zones": [f"{self.link_base}projects/{project}/zones/{z}" for z in zones],
                "quotas": quotas,
            }

        return self._call("GET", f"/compute/v1/projects/{project}/regions/{region}", run)

    def get_zone(self, project: str, zone: str) -> dict[str, Any]:
        def run() -> dict[str, Any]:
            if not re.match(r"^[a-z]+-[a-z]+\d+-[a-z]$", zone):
                raise cexc.not_found(f"projects/{project}/zones/{zone}")
            return {"kind": "compute#zone", "id": str(abs(hash(zone)) % 10**12), "name": zone, "status": "UP",
                    "region": f"{self.link_base}projects/{project}/regions/{region_of(zone)}",
                    "selfLink": f"{self.link_base}projects/{project}/zones/{zone}"}  # fmt: skip

        return self._call("GET", f"/compute/v1/projects/{project}/zones/{zone}", run)

    def get_project(self, project: str) -> dict[str, Any]:
        """What a health check reads to know the Compute Engine API answers for the project."""

        def run() -> dict[str, Any]:
            return {"kind": "compute#project", "id": str(abs(hash(project)) % 10**12), "name": project,
                    "selfLink": f"{self.link_base}projects/{project}",
                    "defaultServiceAccount": "123456789012-compute@developer.gserviceaccount.com"}  # fmt: skip

        return self._call("GET", f"/compute/v1/projects/{project}", run)

    def get_machine_type(self, project: str, zone: str, name: str) -> dict[str, Any]:
        def run() -> dict[str, Any]:
            m = MACHINE_TYPES.get(name)
            path = f"projects/{project}/zones/{zone}/machineTypes/{name}"
            if m is None:
                raise cexc.not_found(path)
            return {"kind": "compute#machineType", "id": str(abs(hash(name)) % 10**12), "name": name,
                    "description": f"{m.chips} {m.generation} TPU chips, {m.cpus} vCPUs", "guestCpus": m.cpus,
                    "memoryMb": m.memory_mb, "zone": zone, "selfLink": self.link_base + path}  # fmt: skip

        return self._call("GET", f"/compute/v1/projects/{project}/zones/{zone}/machineTypes/{name}", run)

    # -- control (what /_fake/* exposes) --------------------------------------------------------
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
            grp = self._groups.get((inst.project, inst.zone, inst.group)) if inst.group else None
            slice_ = [m for m in self._members(grp) if m.status == Status.RUNNING] if grp and grp.policy else [inst]
            for host in slice_:
                host.status, host.preempted, host.kill_at = Status.STOPPING, True, now + self.preempt_notice_s
                op = self._new_op(host.project, f"zones/{zone}", PREEMPTED, host.path, host.uid)
                op.status_message = "Instance was preempted."
                if (host.path, host.uid) in self._hosted:
                    self._event("terminating", "preempted", host)
            return inst.to_json(self.link_base)

        return self._locked(run)

    def configure_capacity(self, spec: dict[str, Any]) -> dict[str, Any]:
        def run() -> dict[str, Any]:
            try:
                self.capacity.configure(spec)
            except (ValueError, KeyError, TypeError) as e:
                raise exc.InvalidArgument(str(e)) from None
            return self.capacity.to_json()

        return self._locked(run)

    def set_quotas(self, spec: dict[str, dict[str, int]]) -> dict[str, Any]:
        def run() -> dict[str, Any]:
            try:
                self.capacity.set_quotas(spec)
            except (ValueError, AttributeError, TypeError) as e:
                raise exc.InvalidArgument(str(e)) from None
            return self.capacity.to_json()

        return self._locked(run)

    def set_latency(self, provision_s: float | None = None, delete_s: float | None = None,
                    preempt_notice_s: float | None = None) -> dict[str, float]:  # fmt: skip
        with self._lock:
            if provision_s is not None:
                self.latency.provision_s = float(provision_s)
            if delete_s is not None:
                self.latency.delete_s = float(delete_s)
            if preempt_notice_s is not None:
                self.preempt_notice_s = float(preempt_notice_s)
            return {**vars(self.latency), "preempt_notice_s": self.preempt_notice_s}

    def reset(self) -> None:
        """Forget everything (every running guest is stopped); capacity, quotas, latency to defaults."""
        try:
            with self._lock:
                for inst in self._instances.values():
                    self._stop_host(inst, "reset")
                self._clear()
                self._faults.clear()
                self.capacity.reset()
                self.latency = Latency(**vars(self._initial[0]))
                self.preempt_notice_s = self._initial[1]
        finally:
            self._flush()

    def state(self) -> dict[str, Any]:
        """Counts and states: what tests assert "nothing left" on."""

        def run() -> dict[str, Any]:
            chips: dict[str, dict[str, int]] = {}
            for i in self._holding():
                key = f"RESERVATION_BOUND/{i.reservation}" if i.reservation else i.model
                chips.setdefault(i.zone, {}).setdefault(key, 0)
                chips[i.zone][key] += i.machine.chips
            return {
                "instances": len(self._instances),
                "instance_templates": len(self._templates),
                "resource_policies": len(self._policies),
                "instance_group_managers": len(self._groups),
                "operations": len(self._ops),
                "instance_states": {i.path: i.status for i in self._instances.values()},
                "chips_in_use": chips,
                "capacity": self.capacity.to_json(),
                "latency": {**vars(self.latency), "preempt_notice_s": self.preempt_notice_s},
                "faults_pending": self.faults_pending(),
            }

        return self._locked(run)

    def set_guest_attribute(self, name: str, worker: int, namespace: str, key: str, value: str) -> None:
        """Where the host simulator's metadata servers forward guest attributes (kept, not served)."""
        with self._lock:
            self._guest[(name, namespace, key)] = value
