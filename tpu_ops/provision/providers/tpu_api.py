"""The Cloud TPU API provider: one queued resource (and its node) per slice, as tpu-ops always did.

A slice id is the queued resource's id, which is also its node's id (``{run_id}-a{n}``). Queued
resource and node states map to ``SliceState``; a create's operation stays inside this module
(``describe`` raises its error when the request never became visible).

An allocation of k > 1 slices is one queued resource with Google's ``multisliceParams`` (node count k):
nodes ``{run_id}-a{n}-0`` .. ``-{k-1}``, granted together or not at all. ``describe`` of the request is
the whole (running once every node is READY, pending while Google repairs one) with each node's record
in ``parts``; ``describe`` of a node id is that slice alone (lost while its node is preempted or gone).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, ClassVar, Final

from tpu_ops.cloud.tpu import (
    NodeRecord,
    NodeState,
    PendingCreate,
    QrState,
    QueuedResourceRecord,
    QueuedResourceRequest,
    TpuApi,
)
from tpu_ops.errors import TpuOpsError, TransientError
from tpu_ops.polling import poll
from tpu_ops.provision.naming import TIER_LABEL, belongs_to, created_at, multislice_node, run_of
from tpu_ops.provision.providers.base import Host, Phase, Provider, SliceRecord, SliceRequest
from tpu_ops.provision.records import Resource
from tpu_ops.settings import Settings
from tpu_ops.tiers import Tier

QR: Final = "queued-resource"
NODE: Final = "node"
_STOCK_WORDS: Final = ("capacity", "exhausted", "stockout")


def slice_record(qr: QueuedResourceRecord, node: NodeRecord | None, node_id: str = "") -> SliceRecord:
    """One slice from a queued resource and its node (None when it has none yet); ``node_id``: which node of
    a multislice request (the slice's id then)."""
    detail, stockout = qr.detail, False
    if qr.state in QrState.ACTIVE:
        if node is not None and node.state in NodeState.READY:
            state, raw = Phase.RUNNING, "ACTIVE"
        elif node is not None and node.state in NodeState.PENDING:
            state, raw = Phase.BOOTING, f"ACTIVE, node {node.state}"
        else:
            state, raw = Phase.LOST, f"node {node.state if node else 'missing'}"
            detail = detail or f"{raw} at ACTIVE"
    elif qr.state in QrState.SUSPENDED:
        state, raw = Phase.LOST, f"queued resource {qr.state}"
    elif qr.state in QrState.FAILED:
        state, raw = Phase.FAILED, f"queued resource {qr.state}"
        stockout = any(w in qr.detail.lower() for w in _STOCK_WORDS)
        detail = qr.detail or "FAILED"
    elif qr.state in QrState.DELETING:
        state, raw = Phase.DELETING, f"queued resource {qr.state}"
    else:
        state, raw = Phase.WAITING, f"queued resource {qr.state}"
    hosts = tuple(Host(i, f"{node.node_id}-w-{i}", ip) for i, ip in enumerate(node.endpoints)) if node else ()
    return SliceRecord(
        backend=TpuApiProvider.name, slice_id=node_id or qr.qr_id, zone=qr.zone, state=state, raw_state=raw,
        tier=qr.tier,
        accelerator_type=(node.accelerator_type if node else "") or qr.accelerator_type, hosts=hosts,
        labels=dict(qr.labels), created_at=node.create_time if node else qr.create_time,
        reservation=qr.reservation, detail=detail, stockout=stockout,
    )  # fmt: skip


class TpuApiProvider(Provider):
    """Slices as Cloud TPU API queued resources (``google-cloud-tpu`` over REST)."""

    name: ClassVar[str] = "tpu-api"
    tiers: ClassVar[frozenset[str]] = frozenset({Tier.RESERVATION, Tier.SPOT, Tier.ON_DEMAND})
    multislice_request: ClassVar[bool] = True

    def __init__(self, settings: Settings, api: TpuApi | None = None) -> None:
        self.settings = settings
        self.api = api or TpuApi(settings)
        # Create operations (with their tier) and request ids stay here, never handed out.
        self._ops: dict[tuple[str, str], PendingCreate] = {}
        self._request_ids: dict[tuple[str, str], str] = {}

    # -- create ------------------------------------------------------------------------------
    def create(self, req: SliceRequest) -> None:
        qreq = QueuedResourceRequest(
            qr_id=req.slice_id, node_id=req.slice_id, accelerator_type=req.accelerator.name,
            runtime_version=req.runtime_version, tier=req.tier, valid_until_s=req.valid_until_s,
            labels=dict(req.labels), reservation=req.reservation, network=req.network,
            service_account=req.service_account, metadata=dict(req.metadata), node_count=req.slices,
        )  # fmt: skip
        key = (req.zone, req.slice_id)
        # The same request id on every retry of one attempt: the API dedupes it too.
        request_id = self._request_ids.setdefault(key, str(uuid.uuid4()))
        pending = self.api.create_queued_resource(req.zone, qreq, request_id)
        if pending is not None:
            self._ops[key] = pending

    # -- reads -------------------------------------------------------------------------------
    def describe(self, zone: str, slice_id: str) -> SliceRecord | None:
        part = multislice_node(slice_id)
        if part is not None:  # one slice of a multislice request: its node
            whole = self.api.find_queued_resource(zone, part[0])
            if whole is not None and whole.node_count > 1:
                node = self.api.find_node(zone, slice_id) if whole.state in QrState.ACTIVE else None
                return slice_record(whole, node, slice_id)
        qr = self.api.find_queued_resource(zone, slice_id)
        if qr is None:
            pending = self._ops.get((zone, slice_id))
            if pending is not None:
                err = self.api.operation_error(pending)
                if err is not None:
                    self._ops.pop((zone, slice_id), None)
                    raise err
            return None
        return self._record(qr)

    def _record(self, qr: QueuedResourceRecord) -> SliceRecord:
        if qr.node_count == 1:
            return slice_record(qr, self.api.find_node(qr.zone, qr.node_id) if qr.state in QrState.ACTIVE else None)
        nodes = [self.api.find_node(qr.zone, n) if qr.state in QrState.ACTIVE else None for n in qr.node_ids]
        parts = tuple(slice_record(qr, n, nid) for nid, n in zip(qr.node_ids, nodes, strict=True))
        whole = slice_record(qr, nodes[0], "")
        if qr.state in QrState.ACTIVE:
            lost = [p.slice_id for p in parts if p.state != Phase.RUNNING]
            # While Google repairs a node the request stays ACTIVE: the whole waits (BOOTING), it is not lost.
            state, raw = (Phase.BOOTING, f"ACTIVE, repairing {', '.join(lost)}") if lost else (Phase.RUNNING, "ACTIVE")
            whole = replace(whole, state=state, raw_state=raw, detail="")
        hosts = tuple(Host(i, h.name, h.endpoint) for i, h in enumerate(h for p in parts for h in p.hosts))
        return replace(whole, hosts=hosts, parts=parts)

    def slices(self, zones: Sequence[str], run_id: str) -> list[SliceRecord]:
        out = []
        for zone in zones:
            for qr in self.api.list_queued_resources(zone):
                if belongs_to(run_id, qr.qr_id, dict(qr.labels)):
                    out.append(self._record(qr))
        return out

    def resources(self, zones: Sequence[str], run_id: str | None = None) -> list[Resource]:
        found: dict[tuple[str, str, str], Resource] = {}
        for zone in zones:
            candidates = [
                (QR, qr.zone, qr.qr_id, dict(qr.labels), qr.state, qr.tier, qr.accelerator_type, qr.create_time)
                for qr in self.api.list_queued_resources(zone)
            ] + [
                (NODE, n.zone, n.node_id, dict(n.labels), n.state,
                 dict(n.labels).get(TIER_LABEL) or (Tier.SPOT if n.spot else Tier.ON_DEMAND), n.accelerator_type,
                 n.create_time)
                for n in self.api.list_nodes(zone)
            ]  # fmt: skip
            for kind, z, rid, labels, state, tier, accel, created in candidates:
                owner = run_of(rid, labels)
                mine = belongs_to(run_id, rid, labels) if run_id is not None else owner is not None
                if mine:
                    res = Resource(kind, z, rid, owner or run_id, state, tier, accel, created_at(labels) or created)
                    found.setdefault((kind, z, rid), res)
        return list(found.values())

    def slice_resources(self, zone: str, slice_id: str) -> list[Resource]:
        # Both names are asked for even when one is missing: a node may outlive its request.
        return [Resource(kind, zone, slice_id, None, "", "", "", None) for kind in (QR, NODE)]

    # -- delete ------------------------------------------------------------------------------
    def request_delete(self, resources: Sequence[Resource]) -> None:
        """Queued resources first (force also deletes their nodes), then stray nodes."""
        for r in sorted(resources, key=lambda r: r.kind != QR):
            if r.state in QrState.DELETING or r.state in NodeState.GOING:
                continue  # already going; delete() still confirms it is gone
            try:
                if r.kind == QR:
                    self.api.delete_queued_resource(r.zone, r.resource_id, force=True)
                else:
                    self.api.delete_node(r.zone, r.resource_id)
            except TpuOpsError:
                # A node whose queued resource is being deleted may refuse a direct delete; the
                # confirm loop asks again.
                pass

    def delete(self, resources: Sequence[Resource], timeout_s: float) -> None:
        self.request_delete(resources)
        pending = {(r.kind, r.zone, r.resource_id): r for r in resources}

        def check() -> bool | None:
            for key, r in list(pending.items()):
                try:
                    if r.kind == QR:
                        cur: Any = self.api.find_queued_resource(r.zone, r.resource_id)
                        going = cur is not None and cur.state in QrState.DELETING
                    else:
                        cur = self.api.find_node(r.zone, r.resource_id)
                        going = cur is not None and cur.state in NodeState.GOING
                except TransientError:
                    continue
                if cur is None:
                    del pending[key]
                elif not going:
                    self.request_delete([r])
            return True if not pending else None

        poll(check, timeout_s=timeout_s, interval_s=self.settings.poll_interval_s,
             what=f"deletion of {sorted(pending)}")  # fmt: skip

    def abandon(self, zone: str, slice_id: str) -> bool:
        try:
            return self.api.delete_queued_resource(zone, slice_id, force=True)
        except TpuOpsError:
            return False  # teardown and the reaper find it by its labels and id
