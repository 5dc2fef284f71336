"""Multi-host slices on Compute Engine: a workload policy, an instance template and a managed
instance group (MIG), each made the way Google documents it for the slice's tier.

- **Policy + template + zonal group** of ``targetSize`` = hosts, ``DO_NOTHING`` on failure (a
  multi-host slice is recovered whole): "Create a MIG with multi-host TPU slice",
  https://cloud.google.com/compute/docs/tpus/create-tpu-mig-multi-host-slice. The regional
  workload policy ``{slice}-wp`` (``HIGH_THROUGHPUT``, the slice's ``acceleratorTopology``), the
  global template ``{slice}-t{hash}`` (the hash of what the hosts run, so a stale template of an
  earlier incarnation is never reused), the group ``{slice}``.
- **BULK only for reservation-bound and flex-start** (``BULK_TIERS``): "Create a MIG that uses the
  bulk mode", https://cloud.google.com/compute/docs/instance-groups/bulk-create-instances-in-mig —
  bulk mode "is only supported with instance templates that specify either a reservation-bound or
  flex-start provisioning model"; "About bulk mode" (Limitations) says the same,
  https://cloud.google.com/compute/docs/instance-groups/about-bulk-mode.
- **Spot**: "Request TPU Spot VMs", https://cloud.google.com/tpu/docs/spot-compute, "Using MIGs for
  multi-host slices": a MIG over a template with ``provisioningModel: SPOT``,
  ``instanceTerminationAction: STOP`` and ``onHostMaintenance: TERMINATE`` (its
  ``--provisioning-model=SPOT --instance-termination-action=STOP --maintenance-policy=TERMINATE``).
  **On-demand**: the same group over a ``STANDARD`` template ("Create a multi-host TPU slice",
  https://cloud.google.com/tpu/docs/quickstart-create-multi-host-slice, uses on-demand).
- **A group that is not BULK can come up partly**: in the individual mode the MIG "creates as many
  instances as possible with the available capacity" (About bulk mode). Hosts up while others are
  still CREATING are billed and useless: the record says so (``partial_hosts``), the ladder waits
  for every host up to ``queue_timeout``, then deletes the slice whole and walks on, the partial
  hold's time and chips in the ledger. A group with no host and every host's last attempt
  stocked out is a stock-out, as a BULK group's ``bulkInstanceOperation`` error is.
- Groups, templates and policies carry no labels: a ``tpu-ops run=... attempt=...`` marker in their
  description and the slice id as a name prefix let a re-run adopt and the reaper find them.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Final

from tpu_ops.cloud.compute import ComputeApi, GroupRecord, InstanceStatus, OpRef, VmSpec, classify, vm_body
from tpu_ops.errors import AlreadyExistsError, CapacityError
from tpu_ops.provision.naming import CREATED_LABEL, created_at
from tpu_ops.provision.providers.base import Host, Phase, SliceRecord, SliceRequest
from tpu_ops.tiers import Tier

BULK_TIERS: Final = frozenset({Tier.RESERVATION, Tier.FLEX_START})
MARKER: Final = re.compile(
    r"tpu-ops run=(?P<run>[a-z][-a-z0-9]*) attempt=(?P<n>[0-9]+) tier=(?P<tier>[a-z-]+) "
    r"accelerator=(?P<acc>[a-z0-9-]+) created=(?P<t>[0-9]+)"
)


def marker(req: SliceRequest, now: float | None = None) -> str:
    """The description that names the run of a group, template or policy (they carry no labels)."""
    t = int(time.time() if now is None else now)
    acc = req.accelerator.name
    return f"tpu-ops run={req.run_id} attempt={req.attempt} tier={req.tier} accelerator={acc} created={t}"


def policy_name(slice_id: str) -> str:
    return f"{slice_id}-wp"


def template_prefix(slice_id: str) -> str:
    return f"{slice_id}-t"


def part_of(slice_id: str, name: str) -> bool:
    """True if ``name`` is the slice itself or one of its parts (template, policy, group member)."""
    return name == slice_id or name.startswith(slice_id + "-")


def template_name(slice_id: str, spec: VmSpec) -> str:
    """``{slice}-t{hash}``: the hash of what the hosts run, creation time left out."""
    timeless = replace(spec, labels={k: v for k, v in spec.labels.items() if k != CREATED_LABEL},
                       description=re.sub(r" created=[0-9]+", "", spec.description))  # fmt: skip
    digest = hashlib.sha256(json.dumps(vm_body(timeless, None), sort_keys=True).encode())
    return template_prefix(slice_id) + digest.hexdigest()[:10]


def create_group(api: ComputeApi, req: SliceRequest, spec: VmSpec, settle: Callable[[OpRef], None]) -> OpRef:
    """Policy and template (each confirmed by its operation, whose asynchronous error ``settle``
    raises), then the group: BULK for ``BULK_TIERS``, else one that creates its hosts one by one."""
    desc = spec.description
    pol = policy_name(req.slice_id)
    where = {"zone": req.zone, "tier": req.tier}  # a stock-out or quota error there is this attempt's
    # AlreadyExists: made by an earlier try of this attempt, the same topology by construction.
    with contextlib.suppress(AlreadyExistsError):
        settle(replace(api.insert_policy(req.region, pol, req.accelerator.topology, desc), **where))
    template = template_name(req.slice_id, spec)
    with contextlib.suppress(AlreadyExistsError):  # the same name is the same content
        settle(replace(api.insert_template(template, spec), **where))
    return api.insert_group(req.zone, req.slice_id, template, req.region, pol, req.accelerator.hosts, desc, req.tier,
                            bulk=req.tier in BULK_TIERS)  # fmt: skip


def describe_group(
    api: ComputeApi, zone: str, group: GroupRecord, preempted: Callable[[str], set[str]], backend: str
) -> SliceRecord:
    """The slice a group makes: RUNNING once every host runs, LOST when a host is lost or the group
    shrank, FAILED on a stock-out before any host exists, else waiting or booting (``partial_hosts``:
    hosts up while others are still to come)."""
    slice_id, target = group.name, group.target_size
    m = MARKER.search(group.description)
    tier = m.group("tier") if m else ""
    accel = m.group("acc") if m else ""
    members = api.managed_instances(zone, slice_id)
    instances = [i for i in (api.get_instance(zone, mi.name) for mi in members if mi.status) if i]
    statuses = sorted({i.status for i in instances})
    gone = preempted(zone) if instances else set()
    lost_ids = {i.name for i in instances if i.id and i.id in gone}
    creating = group.creating > 0 or any(mi.action in ("CREATING", "RECREATING", "VERIFYING") for mi in members)
    # Why hosts are not there yet: a BULK group's progress check, or each missing host's last attempt.
    not_made = [mi for mi in members if not mi.status]
    errors = group.bulk_errors or (not_made[0].errors if not_made and all(mi.errors for mi in not_made) else ())
    running = [i for i in instances if i.status in InstanceStatus.RUNNING and i.internal_ip]
    detail, stockout, partial = "", False, 0
    lost = [i for i in instances if i.status in InstanceStatus.LOST]
    if lost or lost_ids:
        state = Phase.LOST
        names = sorted({*(i.name for i in lost), *lost_ids})
        detail = f"host(s) {', '.join(names)} " + ("preempted" if lost_ids else "/".join(statuses))
    elif not instances and errors and tier != Tier.FLEX_START:  # flex-start waits in the queue
        err = classify(errors, zone=zone, tier=tier)
        state, detail, stockout = Phase.FAILED, str(err), isinstance(err, CapacityError)
    elif 0 < len(instances) < target and not creating:
        state, detail = Phase.LOST, f"{len(instances)} of {target} hosts left"
    elif target > 0 and len(running) == target:  # a resize request's group starts at size 0: not a slice yet
        state = Phase.RUNNING
    elif instances:
        state, partial = Phase.BOOTING, len(running)
        if partial and errors:
            detail = f"{partial} of {target} hosts up; the others: {'; '.join(errors)}"
    else:
        state = Phase.WAITING
    ordered = sorted(instances, key=lambda i: (i.worker_id is None, i.worker_id or 0, i.name))
    hosts = tuple(Host(n, i.hostname, i.internal_ip, i.status) for n, i in enumerate(ordered))
    raw = f"group {len(instances)}/{target} hosts" + (f" {'/'.join(statuses)}" if statuses else "")
    if state == Phase.LOST:
        raw += f": {detail}"
    labels = dict(instances[0].labels) if instances else {}
    return SliceRecord(
        backend=backend, slice_id=slice_id, zone=zone, state=state, raw_state=raw, tier=tier,
        accelerator_type=accel, hosts=hosts, labels=labels, created_at=created_at(labels) or group.created_at,
        detail=detail, stockout=stockout, partial_hosts=partial,
    )  # fmt: skip
