"""The Compute Engine adapter: TPU VM instances, instance templates, managed instance groups and
workload policies as typed records.

The only module that imports ``google.cloud.compute_v1``. Every client is built with the same
``credentials`` and ``client_options`` (:func:`tpu_ops.cloud.clients.compute_options`), and no
operation's ``.result()`` is ever called: it polls through a client built without those options,
i.e. Google's real host. Writes use the ``*_unary`` methods and hand back an :class:`OpRef`;
:meth:`ComputeApi.operation_error` polls it with a Zone/Region/GlobalOperationsClient built here.

Errors are translated by :mod:`tpu_ops.cloud.translate` (through :func:`compute_errors`): a stockout
(``*RESOURCE_POOL_EXHAUSTED*``, ``*STOCKOUT*``) is a ``CapacityError`` for (zone, tier) and a quota
error a ``QuotaError``, whether the create call answered it or its operation ended with it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any, Final, TypeVar

from tpu_ops.cloud import retry
from tpu_ops.cloud.compute_types import (
    PREEMPTED_OP,
    GroupRecord,
    InstanceRecord,
    InstanceStatus,
    ManagedInstanceRecord,
    OpRef,
    PolicyRecord,
    TemplateRecord,
    VmSpec,
    vm_body,
)
from tpu_ops.cloud.translate import capacity_error, google_errors
from tpu_ops.errors import CloudError, NotFoundError, TpuOpsError
from tpu_ops.settings import Settings

SERVICE: Final = "compute"
T = TypeVar("T")


def _ts(value: str) -> float | None:
    """An RFC 3339 ``creationTimestamp`` as epoch seconds."""
    if not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _leaf(url: str) -> str:
    return url.rsplit("/", 1)[-1]


def _error_lines(err: Any) -> tuple[str, ...]:
    return tuple(f"{e.code}: {e.message}" for e in getattr(err, "errors", []) or [])


def classify(lines: Sequence[str], *, zone: str, tier: str, status: int | None = None) -> TpuOpsError:
    """The error for Compute Engine error lines (``CODE: message``): stockout, quota or other."""
    text = "; ".join(lines) or "unknown error"
    found = capacity_error(text, zone=zone, tier=tier, service=SERVICE, status=status)
    if found is not None:
        return found
    return CloudError(f"{SERVICE}: {text}", service=SERVICE, status=status)


def compute_errors(*, zone: str = "", tier: str = "") -> AbstractContextManager[None]:
    """Translate anything the block raises from google-cloud-compute (``zone``: a create there)."""
    return google_errors(SERVICE, zone=zone, tier=tier)


class ComputeApi:
    """TPU VMs in one project through the real ``google-cloud-compute`` clients (REST)."""

    def __init__(self, settings: Settings, options: dict[str, Any] | None = None) -> None:
        from tpu_ops.cloud.clients import compute_options

        self.settings = settings
        self.project = settings.gcp_project
        # a run's (``Clients.compute_options``), else built here; either checked the endpoint already
        self._opts = options if options is not None else compute_options(settings)
        self._clients: dict[str, Any] = {}
        self.call_timeout_s = 30.0

    def client(self, kind: str) -> Any:
        """One cached client per kind, all built with the same credentials and endpoint."""
        if kind not in self._clients:
            from google.cloud import compute_v1

            self._clients[kind] = getattr(compute_v1, kind)(**self._opts)
        return self._clients[kind]

    def _call(self, fn: Callable[[], T]) -> T:
        """One read/delete under the retry policy, with errors translated."""

        def once() -> T:
            with compute_errors():
                return fn()

        return retry.call(self.settings, once)

    @staticmethod
    def region_of(zone: str) -> str:
        return zone.rsplit("-", 1)[0]

    # -- instances ---------------------------------------------------------------------------
    @staticmethod
    def _instance(i: Any, zone: str) -> InstanceRecord:
        meta = {m.key: m.value for m in i.metadata.items} if i.metadata else {}
        wid = meta.get("worker-id", meta.get("agent-worker-number", ""))
        nics = list(i.network_interfaces)
        return InstanceRecord(
            name=i.name, zone=_leaf(i.zone) or zone, status=i.status, labels=dict(i.labels),
            machine_type=_leaf(i.machine_type), internal_ip=nics[0].network_i_p if nics else "",
            hostname=i.hostname or i.name, created_at=_ts(i.creation_timestamp),
            provisioning_model=i.scheduling.provisioning_model if i.scheduling else "",
            worker_id=int(wid) if wid.isdigit() else None, status_message=i.status_message, id=str(i.id or ""),
        )  # fmt: skip

    def get_instance(self, zone: str, name: str) -> InstanceRecord | None:
        try:
            i = self._call(lambda: self.client("InstancesClient").get(
                project=self.project, zone=zone, instance=name, timeout=self.call_timeout_s))  # fmt: skip
        except NotFoundError:
            return None
        return self._instance(i, zone)

    def list_instances(self, zone: str) -> list[InstanceRecord]:
        """Instances in ``zone`` (``-``: every zone, by aggregated list)."""
        c = self.client("InstancesClient")
        if zone == "-":
            pairs = self._call(lambda: list(c.aggregated_list(project=self.project, timeout=self.call_timeout_s)))
            return [self._instance(i, _leaf(scope)) for scope, scoped in pairs for i in scoped.instances]
        items = self._call(lambda: list(c.list(project=self.project, zone=zone, timeout=self.call_timeout_s)))
        return [self._instance(i, zone) for i in items]

    def insert_instance(self, zone: str, name: str, spec: VmSpec, tier: str) -> OpRef:
        """Create one instance (not retried here)."""
        from google.cloud import compute_v1

        body = {"name": name, **vm_body(spec, zone)}
        if spec.request_valid_for_s:
            body["params"] = {"request_valid_for_duration": {"seconds": int(spec.request_valid_for_s)}}
        with compute_errors(zone=zone, tier=tier):
            op = self.client("InstancesClient").insert_unary(
                project=self.project, zone=zone, instance_resource=compute_v1.Instance(body),
                timeout=self.call_timeout_s)  # fmt: skip
        return OpRef("zone", zone, op.name, zone, tier)

    def delete_instance(self, zone: str, name: str) -> OpRef | None:
        """Ask for deletion: its operation, or None if it was already gone."""
        try:
            op = self._call(lambda: self.client("InstancesClient").delete_unary(
                project=self.project, zone=zone, instance=name, timeout=self.call_timeout_s))  # fmt: skip
        except NotFoundError:
            return None
        return OpRef("zone", zone, op.name, zone)

    def zone_operations(self, zone: str, op_type: str) -> list[tuple[str, str, bool]]:
        """``(target id, target name, DONE)`` of every ``op_type`` operation of ``zone``, whoever started it."""
        c = self.client("ZoneOperationsClient")
        req = {"project": self.project, "zone": zone, "filter": f'operationType="{op_type}"'}
        ops = self._call(lambda: list(c.list(request=req, timeout=self.call_timeout_s)))
        ops = [o for o in ops if o.operation_type == op_type]
        return [
            (str(o.target_id or ""), _leaf(o.target_link), getattr(o.status, "name", o.status) == "DONE") for o in ops
        ]

    # -- templates (global) ------------------------------------------------------------------
    def insert_template(self, name: str, spec: VmSpec) -> OpRef:
        from google.cloud import compute_v1

        props = compute_v1.InstanceProperties(vm_body(spec, None))
        tpl = compute_v1.InstanceTemplate(name=name, description=spec.description, properties=props)
        with compute_errors():
            op = self.client("InstanceTemplatesClient").insert_unary(
                project=self.project, instance_template_resource=tpl, timeout=self.call_timeout_s)  # fmt: skip
        return OpRef("global", "", op.name)

    def get_template(self, name: str) -> TemplateRecord | None:
        try:
            t = self._call(lambda: self.client("InstanceTemplatesClient").get(
                project=self.project, instance_template=name, timeout=self.call_timeout_s))  # fmt: skip
        except NotFoundError:
            return None
        return TemplateRecord(t.name, t.description, dict(t.properties.labels), _ts(t.creation_timestamp))

    def list_templates(self) -> list[TemplateRecord]:
        c = self.client("InstanceTemplatesClient")
        items = self._call(lambda: list(c.list(project=self.project, timeout=self.call_timeout_s)))
        return [TemplateRecord(t.name, t.description, dict(t.properties.labels), _ts(t.creation_timestamp))
                for t in items]  # fmt: skip

    def delete_template(self, name: str) -> OpRef | None:
        try:
            op = self._call(lambda: self.client("InstanceTemplatesClient").delete_unary(
                project=self.project, instance_template=name, timeout=self.call_timeout_s))  # fmt: skip
        except NotFoundError:
            return None
        return OpRef("global", "", op.name)

    # -- workload policies (regional) --------------------------------------------------------
    def insert_policy(self, region: str, name: str, topology: str, description: str) -> OpRef:
        from google.cloud import compute_v1

        pol = compute_v1.ResourcePolicy(
            name=name, description=description,
            workload_policy=compute_v1.ResourcePolicyWorkloadPolicy(type_="HIGH_THROUGHPUT",
                                                                    accelerator_topology=topology),
        )  # fmt: skip
        with compute_errors():
            op = self.client("ResourcePoliciesClient").insert_unary(
                project=self.project, region=region, resource_policy_resource=pol, timeout=self.call_timeout_s
            )
        return OpRef("region", region, op.name)

    @staticmethod
    def _policy(p: Any, region: str) -> PolicyRecord:
        return PolicyRecord(p.name, _leaf(p.region) or region, p.description, _ts(p.creation_timestamp))

    def get_policy(self, region: str, name: str) -> PolicyRecord | None:
        try:
            p = self._call(lambda: self.client("ResourcePoliciesClient").get(
                project=self.project, region=region, resource_policy=name, timeout=self.call_timeout_s))  # fmt: skip
        except NotFoundError:
            return None
        return self._policy(p, region)

    def list_policies(self, region: str) -> list[PolicyRecord]:
        """Resource policies in ``region`` (``-``: every region, by aggregated list)."""
        c = self.client("ResourcePoliciesClient")
        if region == "-":
            pairs = self._call(lambda: list(c.aggregated_list(project=self.project, timeout=self.call_timeout_s)))
            return [self._policy(p, _leaf(scope)) for scope, scoped in pairs for p in scoped.resource_policies]
        items = self._call(lambda: list(c.list(project=self.project, region=region, timeout=self.call_timeout_s)))
        return [self._policy(p, region) for p in items]

    def delete_policy(self, region: str, name: str) -> OpRef | None:
        try:
            op = self._call(lambda: self.client("ResourcePoliciesClient").delete_unary(
                project=self.project, region=region, resource_policy=name, timeout=self.call_timeout_s))  # fmt: skip
        except NotFoundError:
            return None
        return OpRef("region", region, op.name)

    # -- managed instance groups (zonal) -----------------------------------------------------
    def insert_group(self, zone: str, name: str, template: str, policy_region: str, policy: str, size: int,
                     description: str, tier: str, *, bulk: bool) -> OpRef:  # fmt: skip
        """A group of ``size`` hosts from ``template`` under the workload ``policy``.

        ``bulk``: BULK creates no VM until all can be created (Google allows it only over
        reservation-bound and flex-start templates); otherwise the group creates its VMs one by one.
        DO_NOTHING leaves a failed VM for us to see (a multi-host slice is recovered whole)."""
        from google.cloud import compute_v1

        mode = "BULK" if bulk else "INDIVIDUAL"
        igm = compute_v1.InstanceGroupManager(
            name=name, description=description, base_instance_name=name, target_size=size,
            instance_template=f"projects/{self.project}/global/instanceTemplates/{template}",
            target_size_policy=compute_v1.InstanceGroupManagerTargetSizePolicy(mode=mode),
            instance_lifecycle_policy=compute_v1.InstanceGroupManagerInstanceLifecyclePolicy(
                default_action_on_failure="DO_NOTHING"),
            resource_policies=compute_v1.InstanceGroupManagerResourcePolicies(
                workload_policy=f"projects/{self.project}/regions/{policy_region}/resourcePolicies/{policy}"),
        )  # fmt: skip
        with compute_errors(zone=zone, tier=tier):
            op = self.client("InstanceGroupManagersClient").insert_unary(
                project=self.project, zone=zone, instance_group_manager_resource=igm, timeout=self.call_timeout_s
            )
        return OpRef("zone", zone, op.name, zone, tier)

    @staticmethod
    def _group(g: Any, zone: str) -> GroupRecord:
        st = g.status
        bulk = _error_lines(st.bulk_instance_operation.last_progress_check.error) if st else ()
        creating = int(g.current_actions.creating) if g.current_actions else 0
        return GroupRecord(g.name, _leaf(g.zone) or zone, int(g.target_size), _leaf(g.instance_template),
                           g.description, _ts(g.creation_timestamp), bool(st.is_stable) if st else False,
                           bulk, creating)  # fmt: skip

    def get_group(self, zone: str, name: str) -> GroupRecord | None:
        try:
            g = self._call(lambda: self.client("InstanceGroupManagersClient").get(
                project=self.project, zone=zone, instance_group_manager=name, timeout=self.call_timeout_s))  # fmt: skip
        except NotFoundError:
            return None
        return self._group(g, zone)

    def list_groups(self, zone: str) -> list[GroupRecord]:
        """Groups in ``zone`` (``-``: every zone, by aggregated list)."""
        c = self.client("InstanceGroupManagersClient")
        if zone == "-":
            pairs = self._call(lambda: list(c.aggregated_list(project=self.project, timeout=self.call_timeout_s)))
            return [self._group(g, _leaf(scope)) for scope, scoped in pairs for g in scoped.instance_group_managers]
        items = self._call(lambda: list(c.list(project=self.project, zone=zone, timeout=self.call_timeout_s)))
        return [self._group(g, zone) for g in items]

    def managed_instances(self, zone: str, group: str) -> list[ManagedInstanceRecord]:
        c = self.client("InstanceGroupManagersClient")
        items = self._call(lambda: list(c.list_managed_instances(
            project=self.project, zone=zone, instance_group_manager=group, timeout=self.call_timeout_s)))  # fmt: skip
        return [ManagedInstanceRecord(m.name or _leaf(m.instance), m.instance_status, m.current_action,
                                      _error_lines(m.last_attempt.errors) if m.last_attempt else ())
                for m in items]  # fmt: skip

    def delete_group(self, zone: str, name: str) -> OpRef | None:
        try:
            op = self._call(lambda: self.client("InstanceGroupManagersClient").delete_unary(
                project=self.project, zone=zone, instance_group_manager=name, timeout=self.call_timeout_s))  # fmt: skip
        except NotFoundError:
            return None
        return OpRef("zone", zone, op.name, zone)

    # -- operations --------------------------------------------------------------------------
    def operation_error(self, ref: OpRef) -> TpuOpsError | None:
        """Refresh ``ref``; its translated error if it finished with one, else None."""
        return self.operation(ref)[1]

    def operation(self, ref: OpRef) -> tuple[bool, TpuOpsError | None]:
        """``(done, error)`` of ``ref``, refreshed with an operations client of the same endpoint."""
        if ref.scope == "zone":
            c, kw = self.client("ZoneOperationsClient"), {"zone": ref.location}
        elif ref.scope == "region":
            c, kw = self.client("RegionOperationsClient"), {"region": ref.location}
        else:
            c, kw = self.client("GlobalOperationsClient"), {}
        op = self._call(lambda: c.get(project=self.project, operation=ref.name, timeout=self.call_timeout_s, **kw))
        if getattr(op.status, "name", op.status) != "DONE":  # an enum in compute_v1's Operation
            return False, None
        lines = _error_lines(op.error) if op.error else ()
        if not lines:
            return True, None
        return True, classify(lines, zone=ref.zone, tier=ref.tier, status=op.http_error_status_code or None)

    # -- project checks (doctor) ---------------------------------------------------------------
    def region_quotas(self, region: str) -> dict[str, tuple[float, float]]:
        """``metric -> (usage, limit)`` of ``region``."""
        r = self._call(lambda: self.client("RegionsClient").get(project=self.project, region=region,
                                                                 timeout=self.call_timeout_s))  # fmt: skip
        return {q.metric: (float(q.usage), float(q.limit)) for q in r.quotas}

    def reservation_vms(self, zone: str, name: str) -> tuple[int, str] | None:
        """``(VM count, machine type)`` a specific reservation holds; None when it does not exist."""
        doc = self.reservation_document(zone, name)
        if doc is None:
            return None
        specific = doc.get("specificReservation") or {}
        machine = str((specific.get("instanceProperties") or {}).get("machineType", ""))
        return int(specific.get("count", 0)), machine.rsplit("/", 1)[-1]

    def reservation_document(self, zone: str, name: str) -> dict[str, Any] | None:
        """``reservations.get`` as its JSON (``specificReservation.count`` / ``inUseCount``); None if absent."""
        try:
            res = self._call(lambda: self.client("ReservationsClient").get(
                project=self.project, zone=zone, reservation=name, timeout=self.call_timeout_s))  # fmt: skip
        except NotFoundError:
            return None
        return dict(type(res).to_dict(res, preserving_proto_field_name=False))


__all__ = [
    "PREEMPTED_OP",
    "ComputeApi",
    "GroupRecord",
    "InstanceRecord",
    "InstanceStatus",
    "ManagedInstanceRecord",
    "OpRef",
    "PolicyRecord",
    "TemplateRecord",
    "VmSpec",
    "classify",
    "compute_errors",
    "vm_body",
]
