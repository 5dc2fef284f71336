"""The Compute Engine provider: a slice is one instance, or a workload policy + template + group.

- Single host (``hosts == 1``): one instance named after the slice (``{run_id}-a{n}``).
- Multi-host: :mod:`.compute_groups` (policy, template, group, each as Google documents it for the
  tier: BULK for reservation-bound and flex-start only; spot and on-demand as a group that creates
  its hosts one by one, so a partly created slice is reported and deleted whole by the ladder).
- Tiers are ``scheduling.provisioningModel``: ``RESERVATION_BOUND`` (+ a ``SPECIFIC_RESERVATION``
  affinity), ``SPOT`` (``instanceTerminationAction: STOP``), ``STANDARD``, ``FLEX_START`` (with
  ``maxRunDuration``), always ``onHostMaintenance: TERMINATE``.
- Every operation waited on (a prerequisite's insert, a slice's create) is polled with an operations
  client of the same endpoint, never the SDK's ``.result()``; one that ends with an error raises
  the project's error (``CapacityError`` for a stock-out, ``QuotaError``, ``CloudError``).
- A slice is lost when a host is stopping, stopped, terminated, suspended or repairing, has a
  ``compute.instances.preempted`` operation, or a group has fewer hosts than it had; it is then
  deleted whole (group → instances → template → policy, each confirmed gone) and the ladder walks
  again.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Sequence
from typing import Any, ClassVar, Final

from tpu_ops.accelerators import ACCELERATOR_TYPES, COMPUTE_IMAGE_PROJECT
from tpu_ops.cloud.compute import PREEMPTED_OP, ComputeApi, InstanceRecord, InstanceStatus, OpRef, VmSpec
from tpu_ops.errors import (
    DeadlineError,
    NotFoundError,
    SpecError,
    TpuOpsError,
    TransientError,
)
from tpu_ops.provision.naming import RUN_LABEL, TIER_LABEL, attempt_of, created_at, run_of
from tpu_ops.provision.providers.base import Host, Phase, Provider, SliceRecord, SliceRequest
from tpu_ops.provision.providers.compute_groups import MARKER, create_group, describe_group, marker, part_of
from tpu_ops.provision.records import Resource
from tpu_ops.settings import Settings
from tpu_ops.tiers import BACKEND_TIERS, Backend, Tier

INSTANCE: Final = "instance"
GROUP: Final = "instance-group"
TEMPLATE: Final = "instance-template"
POLICY: Final = "workload-policy"
ACCEL_LABEL: Final = "tpu-ops-accelerator"
MODELS: Final = {
    Tier.RESERVATION: "RESERVATION_BOUND",
    Tier.SPOT: "SPOT",
    Tier.ON_DEMAND: "STANDARD",
    Tier.FLEX_START: "FLEX_START",
}
# Deletion order: what uses a thing goes before it.
ORDER: Final = (GROUP, INSTANCE, TEMPLATE, POLICY)


def reservation_value(name: str) -> str:
    """The ``reservationAffinity`` value: a bare name (this project), or ``projects/P/reservations/N``
    for a shared reservation given as ``projects/P/zones/Z/reservations/N``."""
    parts = name.split("/")
    if len(parts) == 6 and parts[0] == "projects" and parts[2] == "zones":
        return f"projects/{parts[1]}/reservations/{parts[5]}"
    return name


class ComputeProvider(Provider):
    """Slices as Compute Engine TPU VMs (``google-cloud-compute`` over REST)."""

    name: ClassVar[str] = Backend.COMPUTE.value
    tiers: ClassVar[frozenset[str]] = BACKEND_TIERS[Backend.COMPUTE]

    def __init__(self, settings: Settings, api: ComputeApi | None = None) -> None:
        self.settings = settings
        self.api = api or ComputeApi(settings)
        self._ops: dict[tuple[str, str], OpRef] = {}  # the create operation of each slice, kept here

    # -- create ------------------------------------------------------------------------------
    def vm_spec(self, req: SliceRequest, description: str) -> VmSpec:
        acc = req.accelerator
        if not acc.machine_type:
            raise SpecError(f"Compute Engine does not offer {acc.name} ({acc.generation}); use backend 'tpu-api'")
        labels = {**req.labels, ACCEL_LABEL: acc.name}
        return VmSpec(
            machine_type=acc.machine_type, image_family=req.runtime_version, image_project=COMPUTE_IMAGE_PROJECT,
            provisioning_model=MODELS[req.tier], labels=labels, metadata=dict(req.metadata),
            reservation=reservation_value(req.reservation),
            max_run_duration_s=req.max_run_duration_s,
            request_valid_for_s=req.valid_until_s if req.tier == Tier.FLEX_START else None,
            network=req.network, service_account=req.service_account, description=description,
        )  # fmt: skip

    def create(self, req: SliceRequest) -> None:
        spec = self.vm_spec(req, marker(req))
        if req.accelerator.hosts == 1:
            self._ops[(req.zone, req.slice_id)] = self.api.insert_instance(req.zone, req.slice_id, spec, req.tier)
            return
        self._ops[(req.zone, req.slice_id)] = create_group(self.api, req, spec, self._settle)

    def _settle(self, ref: OpRef, timeout_s: float = 120.0) -> None:
        """Wait for a prerequisite's operation; raise its error."""
        deadline = time.monotonic() + timeout_s
        while True:
            done, err = self.api.operation(ref)
            if err is not None:
                raise err
            if done:
                return
            if time.monotonic() > deadline:
                msg = f"compute: operation {ref.name} not done after {timeout_s:.0f}s"
                raise TransientError(msg, service="compute")
            time.sleep(self.settings.poll_interval_s)

    # -- reads -------------------------------------------------------------------------------
    def reservation_document(self, zone: str, name: str) -> dict[str, Any] | None:
        """The reservation as Compute Engine answers it: the fleet view's count / inUseCount."""
        return self.api.reservation_document(zone, name)

    def describe(self, zone: str, slice_id: str) -> SliceRecord | None:
        inst = self.api.get_instance(zone, slice_id)
        if inst is not None:
            return self._single(inst)
        group = self.api.get_group(zone, slice_id)
        if group is not None:
            return describe_group(self.api, zone, group, self._preempted, self.name)
        ref = self._ops.get((zone, slice_id))
        if ref is not None:
            err = self.api.operation_error(ref)
            if err is not None:
                self._ops.pop((zone, slice_id), None)
                raise err
        return None

    def _single(self, inst: InstanceRecord) -> SliceRecord:
        status = inst.status
        if status in InstanceStatus.RUNNING and inst.internal_ip:
            state = Phase.RUNNING
        elif status in InstanceStatus.LOST:
            state = Phase.LOST
        elif status == "PENDING":
            state = Phase.WAITING
        else:
            state = Phase.BOOTING
        if state != Phase.LOST and inst.id and inst.id in self._preempted(inst.zone):
            state = Phase.LOST
        return SliceRecord(
            backend=self.name, slice_id=inst.name, zone=inst.zone, state=state, raw_state=f"instance {status}",
            tier=inst.labels.get(TIER_LABEL, ""), accelerator_type=inst.labels.get(ACCEL_LABEL, ""),
            hosts=(Host(0, inst.hostname, inst.internal_ip, status),) if inst.internal_ip else (),
            labels=dict(inst.labels), created_at=created_at(dict(inst.labels)) or inst.created_at,
            detail=inst.status_message if state == Phase.LOST else "",
        )  # fmt: skip

    def _preempted(self, zone: str) -> set[str]:
        """Ids of instances with a ``compute.instances.preempted`` operation (ids, not names: a slice recreated
        under the same name must not inherit its predecessor's preemption)."""
        try:
            return {i for i, _, _ in self.api.zone_operations(zone, PREEMPTED_OP) if i}
        except (NotFoundError, TransientError):
            return set()

    def slices(self, zones: Sequence[str], run_id: str) -> list[SliceRecord]:
        ids: dict[tuple[str, str], None] = {}
        for r in self.resources(zones, run_id):
            if r.kind in (INSTANCE, GROUP) and attempt_of(run_id, r.resource_id):
                ids.setdefault((r.zone, r.resource_id), None)
        return [rec for zone, sid in ids if (rec := self.describe(zone, sid)) is not None]

    def resources(self, zones: Sequence[str], run_id: str | None = None) -> list[Resource]:
        out: list[Resource] = []

        def mine(name: str, owner: str | None) -> bool:
            if run_id is None:
                return owner is not None
            named = re.fullmatch(re.escape(run_id) + r"-a[1-9][0-9]*(-.+)?", name) is not None
            return owner == run_id or (owner is None and named)

        regions: dict[str, None] = {}
        for zone in zones:
            regions.setdefault("-" if zone == "-" else ComputeApi.region_of(zone), None)
            for inst in self.api.list_instances(zone):
                labels = dict(inst.labels)
                owner = run_of(inst.name, labels)
                if mine(inst.name, owner):
                    acc = ACCELERATOR_TYPES.get(labels.get(ACCEL_LABEL, ""))
                    out.append(Resource(INSTANCE, inst.zone, inst.name, owner or run_id, inst.status,
                                        labels.get(TIER_LABEL, ""), acc.name if acc else "",
                                        created_at(labels) or inst.created_at, self.name,
                                        acc.chips_per_host if acc else None))  # fmt: skip
            for g in self.api.list_groups(zone):
                m = MARKER.search(g.description)
                if mine(g.name, m.group("run") if m else None):
                    out.append(self._part(GROUP, g.zone, g.name, g.description, g.created_at, run_id))
        for t in self.api.list_templates():
            m = MARKER.search(t.description)
            owner = (m.group("run") if m else None) or (dict(t.labels).get(RUN_LABEL) if t.labels else None)
            if mine(t.name, owner):
                out.append(self._part(TEMPLATE, "global", t.name, t.description, t.created_at, run_id))
        for region in regions:
            for p in self.api.list_policies(region):
                m = MARKER.search(p.description)
                if mine(p.name, m.group("run") if m else None):
                    out.append(self._part(POLICY, p.region, p.name, p.description, p.created_at, run_id))
        return out

    def _part(self, kind: str, zone: str, name: str, desc: str, created: float | None, run_id: str | None) -> Resource:
        m = MARKER.search(desc)
        return Resource(kind, zone, name, m.group("run") if m else run_id, "", m.group("tier") if m else "",
                        m.group("acc") if m else "", float(m.group("t")) if m else created, self.name)  # fmt: skip

    def slice_resources(self, zone: str, slice_id: str) -> list[Resource]:
        run = slice_id.rsplit("-a", 1)[0]
        found = [r for r in self.resources([zone], run) if part_of(slice_id, r.resource_id)]
        if not any(r.resource_id == slice_id for r in found):
            # Not listed (yet): ask for both forms by name anyway, as the TPU provider does.
            found += [Resource(GROUP, zone, slice_id, run, "", "", "", None, self.name),
                      Resource(INSTANCE, zone, slice_id, run, "", "", "", None, self.name)]  # fmt: skip
        return found

    # -- delete ------------------------------------------------------------------------------
    def _ask(self, r: Resource) -> OpRef | None:
        """Ask for deletion of one resource: its operation, or None if it is already gone."""
        if r.kind == GROUP:
            return self.api.delete_group(r.zone, r.resource_id)
        if r.kind == INSTANCE:
            return self.api.delete_instance(r.zone, r.resource_id)
        if r.kind == TEMPLATE:
            return self.api.delete_template(r.resource_id)
        return self.api.delete_policy(r.zone, r.resource_id)

    def _exists(self, r: Resource) -> bool:
        if r.kind == GROUP:
            return self.api.get_group(r.zone, r.resource_id) is not None
        if r.kind == INSTANCE:
            return self.api.get_instance(r.zone, r.resource_id) is not None
        if r.kind == TEMPLATE:
            return self.api.get_template(r.resource_id) is not None
        return self.api.get_policy(r.zone, r.resource_id) is not None

    def request_delete(self, resources: Sequence[Resource]) -> None:
        """Groups and single instances now; templates and policies are refused while in use, so
        only ``delete`` (which waits for the groups first) removes them."""
        for r in resources:
            if r.kind in (GROUP, INSTANCE):
                with contextlib.suppress(TpuOpsError):  # teardown and the reaper find it again
                    self._ask(r)

    def delete(self, resources: Sequence[Resource], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        for kind in ORDER:
            stage = [r for r in resources if r.kind == kind]
            if stage:
                self._delete_stage(stage, deadline)

    def _delete_stage(self, stage: Sequence[Resource], deadline: float) -> None:
        """Ask, then wait until each is gone; a delete whose operation ends with an error (Google's
        asynchronous failure) is asked again at once, and its error named if the deadline passes."""
        pending = {(r.zone, r.resource_id): r for r in stage}
        asked_at: dict[tuple[str, str], float] = {}
        ops: dict[tuple[str, str], OpRef] = {}
        failed: dict[tuple[str, str], str] = {}
        reask_s = max(1.0, 20 * self.settings.poll_interval_s)
        while pending:
            for key, r in list(pending.items()):
                try:
                    # asked again only with no operation of ours under way (Google may refuse a second
                    # delete of what it is deleting: 400 resourceNotReady) or after one failed
                    if key not in asked_at or (key not in ops and time.monotonic() - asked_at[key] > reask_s):
                        asked_at[key] = time.monotonic()
                        ref = self._ask(r)
                        if ref is None:
                            del pending[key]
                            continue
                        ops[key] = ref
                    if not self._exists(r):
                        del pending[key]
                        continue
                    if key in ops:
                        done, err = self.api.operation(ops[key])
                        if done:
                            del ops[key]
                        if err is not None:
                            failed[key] = str(err)
                            del asked_at[key]  # the delete failed: ask again now
                except TransientError:
                    continue
                except TpuOpsError:
                    continue  # e.g. a template still in use while its group goes: ask again later
            if not pending:
                return
            if time.monotonic() > deadline:
                why = "".join(f"; {k[1]}: {failed[k]}" for k in sorted(pending) if k in failed)
                raise DeadlineError(f"compute: still there after the deadline: {sorted(pending)}{why}")
            time.sleep(self.settings.poll_interval_s)

    def await_delete(self, zone: str, slice_id: str, timeout_s: float) -> bool:
        """Wait while Compute Engine deletes the slice (a delete operation not DONE targets it), then delete
        what is left of it (a group's template and policy go after the group); False, asking nothing, when no
        delete of it is under way (its asker died before asking) or it outlasts ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:  # the operations first: one DONE means the slice is gone by the next read
                asked = any(n == slice_id and not done for _, n, done in self.api.zone_operations(zone, "delete"))
                if self.api.get_instance(zone, slice_id) is None and self.api.get_group(zone, slice_id) is None:
                    break
                if not asked:
                    return False
            except TransientError:
                pass
            if time.monotonic() > deadline:
                return False
            time.sleep(self.settings.poll_interval_s)
        rest = [r for r in self.slice_resources(zone, slice_id) if r.resource_id != slice_id]
        if rest:
            self.delete(rest, max(1.0, deadline - time.monotonic()))
        return True

    def abandon(self, zone: str, slice_id: str) -> bool:
        """Delete the slice whole, briefly waiting: a group that never got its hosts goes at once, and
        its template and policy can only go after it (teardown and the reaper catch what lingers)."""
        try:
            return bool(self.delete_slice(zone, slice_id, timeout_s=max(30.0, 50 * self.settings.poll_interval_s)))
        except (TpuOpsError, TimeoutError):
            return False
