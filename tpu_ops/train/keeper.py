"""The run's allocation across incarnations: gathered, described to the workers, given back whole or but one slice.

When one slice of a multislice allocation is lost, only that slice is deleted: the healthy ones are
kept (still billed, their workers stopped at the step in hand and waiting) while the ladder replaces
it, at most ``keep_healthy_for``; if the replacement does not come in that time everything is given
back and a whole new allocation is gathered. A stall, a single slice or ``keep_healthy_for: 0``
gives everything back at once.

On the Cloud TPU API the k slices are one multislice queued resource, and Google repairs a lost slice
itself (a new node of the same name, then every other node's VMs restarted): the keeper waits for that
repair instead of deleting the slice, at most ``keep_healthy_for``, then gives the whole request back.

A supervisor taking over a run whose slice was lost while none ran holds nothing yet: :meth:`Keeper.adopt`
takes the incarnation's slices from the run state when the lost one is named and every other one still
runs (asked by name), so the rest is the live supervisor's path; else everything is given back.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from tpu_ops.accelerators import Shape
from tpu_ops.agent.job import ALLOCATION_DOC
from tpu_ops.errors import ProvisioningError, TpuOpsError, TransientError
from tpu_ops.layout import RunLayout
from tpu_ops.polling import poll
from tpu_ops.provision import ledger as L
from tpu_ops.provision.allocation import Allocation
from tpu_ops.provision.launch import Launch
from tpu_ops.provision.lease import SliceLease
from tpu_ops.provision.providers import SliceState
from tpu_ops.provision.records import Slice
from tpu_ops.provision.shapes import gather_shapes, shape_fields
from tpu_ops.provision.steps import obtained
from tpu_ops.specs.slice import SliceSpec
from tpu_ops.train.incarnations import startup_script
from tpu_ops.train.layout import put_json
from tpu_ops.train.runstate import SliceState as Recorded


class Keeper:
    """Owns ``slices`` (the live allocation, slice 0 first), ``kept`` (indices kept for the next one) and
    ``carried`` (the indices of ``slices`` held over from the allocation before: the run state records them),
    ``repaired`` (those Google repaired in a kept multislice request: the request kept, the node new)."""

    def __init__(self, lease: SliceLease, spec: SliceSpec, gcs: Any, layout: RunLayout, ledger: L.Ledger) -> None:
        self.lease, self.spec, self.gcs, self.layout, self.ledger = lease, spec, gcs, layout, ledger
        self.slices: tuple[Slice, ...] = ()
        self.kept: tuple[int, ...] = ()
        self.carried: tuple[int, ...] = ()
        self.repaired: tuple[int, ...] = ()
        self._repairing: tuple[int, ...] = ()  # what _await_repair saw repaired, for the next allocation
        self.shape: Shape = spec.shape_list[0]  # the live allocation's shape (elastic: maybe smaller than the target)

    def obtain(self, run_id: str, incarnation: str) -> tuple[Slice, ...]:
        """The allocation of ``incarnation`` (kept slices adopted, the lost one replaced), its document written."""
        # One multislice request keeps its metadata across incarnations (Google restarts its VMs with it): its
        # agents take the incarnation from the job document instead.
        one = self.spec.slices > 1 and self.lease.provider.multislice_request
        script = startup_script(run_id, self.layout, "" if one else incarnation)
        launch = Launch(script, self.spec.slices)
        alloc: Allocation | None = None
        if self.spec.shapes:  # elastic: the target shape first, at every allocation (provision.shapes)
            meta = lambda count: Launch(script, count).metadata  # noqa: E731
            alloc, self.shape = gather_shapes(self.lease.spec, self.lease.gather, meta, self.ledger, self._live)
        elif self.kept:
            try:
                alloc = self.lease.gather(launch.metadata, zone=self.slices[0].zone, within=self.spec.keep_healthy_for)
            except ProvisioningError:
                self.kept = ()  # gather gave everything back: a whole new allocation
        if alloc is None:
            alloc = self.lease.gather(launch.metadata)
        if self.spec.slices > 1 or self.spec.shapes:  # where each worker is (and on what shape): agents wait for it
            shape = shape_fields(self.spec.shape_list[0], self.shape) if self.spec.shapes else {}
            doc = {**alloc.document(incarnation), "kept": list(self.kept), **shape}
            put_json(self.gcs, self.layout.state(ALLOCATION_DOC), doc)
        fixed = tuple(i for i in self._repairing if i in self.kept)  # kept through gather: Google's new node
        self.carried, self.repaired = tuple(i for i in self.kept if i not in fixed), fixed
        self.slices, self.kept, self._repairing = alloc.slices, (), ()
        return self.slices

    def _live(self) -> list[str]:
        """The accelerator types of the run's running slices (a successor adopts a live smaller shape)."""
        found = self.lease.provider.slices(list(self.spec.zones), self.lease.run_id)
        return [r.accelerator_type for r in found if r.state in SliceState.RUNNING]

    def _may_keep(self) -> bool:
        # elastic shapes: the next allocation may be of another shape, so nothing is kept
        return bool(self.spec.keep_healthy_for.total_seconds()) and not self.spec.shapes

    def adopt(self, recorded: Sequence[Recorded], lost: int | None, exited: Collection[int] = ()) -> bool:
        """Hold ``recorded`` (an incarnation's slices, taken over from a supervisor that died) when slice ``lost``
        went and every other one still runs, its workers not exited (``exited``: slices with an exit report):
        then ``give_back(lost)`` keeps them. False, holding nothing, when that is not known to be so."""
        if self.slices or lost is None or len(recorded) < 2 or not self._may_keep() or set(exited) - {lost}:
            return False
        held: list[Slice] = []
        acc, run, plane = self.lease.spec.slice.accelerator, self.lease.run_id, self.lease.provider.name
        for r in sorted(recorded, key=lambda r: r.index):
            try:
                rec = self.lease.provider.describe(r.zone, r.resource_id)
            except TpuOpsError:  # the control plane cannot say: nothing is known to run
                return False
            if r.index == lost:  # (its bill still open) On the TPU API Google's repair shows as a node newer than
                # the lost one; a node already being repaired, or repaired, is the new one: any node running will do
                when = rec.created_at if rec is not None and rec.state in SliceState.LOST else None
                hosts = r.hosts or acc.hosts
                ids = (r.resource_id, r.resource_id, r.zone, r.tier, acc.name, acc.chips, hosts, ())
                held.append(Slice(run, *ids, created_at=when, backend=plane))
            elif rec is None or rec.state not in SliceState.RUNNING:
                return False
            else:  # billed since its first grant: the ledger has it open, nothing is opened again
                held.append(obtained(self.lease.spec, run, rec, self.ledger, plane, ()))
        self.slices = tuple(held)
        return True

    def give_back(self, lost: int | None, timeout_s: float = 900.0) -> None:
        """Everything, or (``lost`` of a multislice allocation, keep_healthy_for > 0) that slice only."""
        if lost is None or len(self.slices) < 2 or not self._may_keep():
            self.kept = ()
            self.lease.release()
            return
        s = self.slices[lost]
        if self.lease.provider.multislice_request:
            return self._await_repair(lost, s)
        self._delete(s, timeout_s)
        self.kept = tuple(i for i in range(len(self.slices)) if i != lost)

    def _delete(self, s: Slice, timeout_s: float) -> None:
        """Delete lost slice ``s`` and close its bill, unless a predecessor that died did some of it: deleted it
        (its bill closed since the loss: a replacement of the same name may be billing since), or asked (its
        delete may still be under way: waited for, not asked again unless none is)."""
        rid, provider = s.queued_resource, self.lease.provider
        since = _since_lost(self.ledger, rid)
        if L.GONE in since or not self.ledger.is_open(rid):
            return
        if L.DELETE_REQUESTED not in since:
            self.ledger.append(L.DELETE_REQUESTED, resource_id=rid, zone=s.zone)
        if L.DELETE_REQUESTED not in since or not provider.await_delete(s.zone, rid, timeout_s):
            provider.delete_slice(s.zone, rid, timeout_s)
        self.ledger.append(L.GONE, resource_id=rid, zone=s.zone)

    def _await_repair(self, lost: int, s: Slice) -> None:
        """Google repairs slice ``lost`` of a multislice request: wait for its new node (the others keep their
        nodes, their VMs restarted), at most ``keep_healthy_for``; else give everything back."""
        if self.ledger.is_open(s.queued_resource):  # (else closed by a predecessor that died awaiting the repair)
            self.ledger.append(L.GONE, resource_id=s.queued_resource, zone=s.zone)  # preempted: its chips stop

        def repaired() -> bool | None:
            try:
                rec = self.lease.provider.describe(s.zone, s.queued_resource)
            except TransientError:
                return None
            new = rec is not None and rec.state in SliceState.RUNNING and rec.created_at != s.created_at
            return True if new else None

        try:
            poll(
                repaired,
                timeout_s=self.spec.keep_healthy_for.total_seconds(),
                interval_s=self.lease.settings.poll_interval_s,
                what=f"Google's repair of {s.queued_resource}",
            )
        except TimeoutError:
            self.kept = ()
            self.lease.release()
            return
        self.kept = tuple(range(len(self.slices)))  # every node of the request, the repaired one too, runs on
        self._repairing = (lost,)


def _since_lost(ledger: L.Ledger, rid: str) -> list[str]:
    """The kinds of ``rid``'s ledger events since its loss: its last PREEMPTED, else its last ACTIVE."""
    kinds = [str(e["kind"]) for e in ledger.events() if e.get("resource_id") == rid]
    mark = next((k for k in (L.PREEMPTED, L.ACTIVE) if k in kinds), None)
    return kinds[len(kinds) - kinds[::-1].index(mark) :] if mark else []
