"""Observing an allocation: the facts :func:`tpu_ops.train.verdict.decide` judges, read from GCS and the provider.

Reading is here, deciding is in ``train.verdict``, acting is in ``train.supervisor``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tpu_ops.layout import RunLayout
from tpu_ops.provision.providers import Provider
from tpu_ops.train import notices
from tpu_ops.train.incarnations import done_marker, mine
from tpu_ops.train.layout import list_json
from tpu_ops.train.runstate import IncarnationState
from tpu_ops.train.verdict import Facts, SliceFacts


def slice_facts(provider: Provider, index: int, zone: str, slice_id: str) -> SliceFacts:
    """One slice as its control plane describes it (``phase`` None when it no longer knows it)."""
    rec = provider.describe(zone, slice_id)
    if rec is None:
        return SliceFacts(index, None, "slice missing")
    hosts = tuple(h.state for h in sorted(rec.hosts, key=lambda h: h.index))
    return SliceFacts(index, rec.state, rec.raw_state, hosts)


def observe(
    gcs: Any,
    layout: RunLayout,
    provider: Provider | None,
    inc: IncarnationState,
    slices: Sequence[tuple[str, str]] = (),
    *,
    with_done: bool = True,
    hosts: int = 1,
    since_progress_s: float = 0.0,
    stall_limit_s: float = float("inf"),
) -> Facts:
    """A full observation of ``inc``: its notices, the state of each slice (``(zone, id)`` pairs, default the
    incarnation's one), its workers' exit reports and the DONE marker. ``provider`` None: notices only (the
    cheap check between full polls)."""
    found = tuple(notices.notices(gcs, layout, inc.id, inc.ready_at or 0.0))
    if provider is None:
        return Facts(notices=found)
    pairs = list(slices) or [(inc.zone, inc.queued_resource)]
    return Facts(
        slices=tuple(slice_facts(provider, i, zone, sid) for i, (zone, sid) in enumerate(pairs)),
        notices=found,
        reports=tuple(mine(inc, list_json(gcs, layout.workers))),
        done=done_marker(gcs, layout) if with_done else None,
        hosts=hosts,
        since_progress_s=since_progress_s,
        stall_limit_s=stall_limit_s,
    )
