"""A supervisor killed while it deleted the lost slice of a 2-slice Compute Engine allocation (between the
ledger's DELETE_REQUESTED and GONE): its successor (``Keeper.adopt``, ``give_back``) does not ask Compute
Engine a second time while that delete is under way (Google may refuse it: 400 resourceNotReady); it waits
for the slice to go, closes its bill once and keeps the healthy slice. If the predecessor died before its
request left (the ledger line written, no delete operation), the successor asks, once.

The fake Compute Engine over HTTP, Google's client; a single-host slice (one instance) and a 2-host one (a
group, its template and workload policy: what is left of it once the group is gone is deleted next)."""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from tpu_ops.provision.lease import SliceLease
from tpu_ops.provision.ledger import ACTIVE, DELETE_REQUESTED, GONE, PREEMPTED, Ledger
from tpu_ops.specs.slice import SliceSpec
from tpu_ops.train.keeper import Keeper
from tpu_ops.train.runstate import SliceState as Recorded

ZONE = "us-east5-a"
DELETE_S = 1.5  # a VM's (and so a group's) time from the delete to gone


@pytest.fixture
def compute(compute_url: str, fakes: Any) -> Iterator[Any]:
    req = partial(fakes.call, compute_url)
    req("POST", "/_fake/reset")
    req("POST", "/_fake/capacity", {ZONE: {"SPOT": 64}})
    req("POST", "/_fake/latency", {"delete_s": DELETE_S})
    yield req
    req("POST", "/_fake/latency", {"delete_s": 0.0})
    state = req("GET", "/_fake/state")
    left = ("instances", "instance_templates", "resource_policies", "instance_group_managers")
    assert sum(int(state[k]) for k in left) == 0, state


def _deletes(provider: Any, name: str) -> int:
    """The deletes of slice ``name`` (its instance or group) Compute Engine was asked for: their operations."""
    client = provider.api.client("ZoneOperationsClient")  # Google's client, as any reader of them
    ops = client.list(request={"project": "tpu-ops-local", "zone": ZONE, "filter": 'operationType="delete"'})
    return sum(1 for o in ops if o.target_link.rsplit("/", 1)[-1] == name)


def _kinds(settings: Any, run_id: str, rid: str) -> list[str]:
    return [
        e["kind"] for e in Ledger(settings, run_id).events() if e.get("resource_id") == rid and e["kind"] != "attempt"
    ]


def _two_slices(
    compute: Any, settings: Any, fakes: Any, run_id: str, accelerator: str
) -> tuple[SliceSpec, SliceLease, list[Recorded]]:
    """2 slices gathered by a first lease (the predecessor's), slice 1's host preempted and the loss in the
    ledger; the predecessor's lease and the slices as the run state recorded them."""
    spec = fakes.slice_request(["spot"], accelerator, "us-east5", [ZONE], "compute")
    sl = SliceSpec.model_validate({**spec.slice.model_dump(), "slices": 2, "keep_healthy_for": "2m"})
    first = SliceLease(spec.model_copy(update={"slice": sl}), run_id, settings)
    slices = first.gather().slices
    lost = slices[1].queued_resource
    host = sorted(n.rsplit("/", 1)[-1] for n in compute("GET", "/_fake/state")["instance_states"] if lost in n)[0]
    compute("POST", f"/_fake/zones/{ZONE}/instances/{host}:preempt")
    Ledger(settings, run_id).append(PREEMPTED, resource_id=lost, zone=ZONE)
    return sl, first, [Recorded(i, s.queued_resource, s.zone, s.tier, s.hosts) for i, s in enumerate(slices)]


@pytest.mark.parametrize("accelerator", ["v5p-8", "v5p-16"])
@pytest.mark.parametrize("request_left", [True, False], ids=["delete-under-way", "killed-before-asking"])
def test_a_successor_waits_for_the_delete_under_way_and_asks_only_when_none_is(
    compute: Any, compute_url: str, tmp_path: Path, google_auth: Any, fakes: Any, accelerator: str, request_left: bool
) -> None:
    run_id = f"midkill-{accelerator[-1]}-{int(request_left)}"
    settings = fakes.settings(tmp_path, google_auth, compute_endpoint=compute_url)
    sl, first, recorded = _two_slices(compute, settings, fakes, run_id, accelerator)
    successor = SliceLease(first.spec, run_id, settings)
    s0, lost = recorded[0].resource_id, recorded[1].resource_id
    try:
        # The predecessor, killed mid-recovery: the lost slice's delete in the ledger and (request_left) asked of
        # Compute Engine, the slice not gone yet.
        Ledger(settings, run_id).append(DELETE_REQUESTED, resource_id=lost, zone=ZONE)
        if request_left:
            first.provider.request_delete(first.provider.slice_resources(ZONE, lost))
            assert first.provider.describe(ZONE, lost) is not None  # still going when the successor starts
        keeper = Keeper(successor, sl, None, None, Ledger(settings, run_id))  # type: ignore[arg-type]  # gcs, layout
        assert keeper.adopt(recorded, 1)
        keeper.give_back(1)
        assert keeper.kept == (0,)
        # returned once the slice went (GONE is when the bill stops), every part of it: a group's template and
        # policy too; Compute Engine asked once for its delete
        assert [r.resource_id for r in successor.provider.resources([ZONE], run_id) if lost in r.resource_id] == []
        assert _deletes(successor.provider, lost) == 1
        assert successor.provider.describe(ZONE, s0) is not None  # the healthy slice kept
        assert _kinds(settings, run_id, lost) == [ACTIVE, PREEMPTED, DELETE_REQUESTED, GONE]  # its bill closed once
    finally:
        successor.release()
        first.release()


def test_a_replacement_the_predecessor_got_before_it_died_is_not_deleted(
    compute: Any, compute_url: str, tmp_path: Path, google_auth: Any, fakes: Any
) -> None:
    """Killed once the replacement's bill opened, before the run state named it: the lost slice's bill was
    closed since the loss, so what runs under its name (and bills) is the replacement, kept for the gather."""
    run_id = "midkill-replaced"
    settings = fakes.settings(tmp_path, google_auth, compute_endpoint=compute_url)
    sl, first, recorded = _two_slices(compute, settings, fakes, run_id, "v5p-8")
    successor = SliceLease(first.spec, run_id, settings)
    lost = recorded[1].resource_id
    try:
        predecessor = Keeper(first, sl, None, None, Ledger(settings, run_id))  # type: ignore[arg-type]
        assert predecessor.adopt(recorded, 1)
        predecessor.give_back(1)  # the lost slice deleted, its bill closed
        replacement = first.gather(zone=ZONE).slices[1]  # slice 0 adopted, slice 1 new: its bill opens
        keeper = Keeper(successor, sl, None, None, Ledger(settings, run_id))  # type: ignore[arg-type]
        assert keeper.adopt(recorded, 1)
        keeper.give_back(1)
        assert keeper.kept == (0,) and _deletes(successor.provider, lost) == 1  # the lost one's delete only
        rec = successor.provider.describe(ZONE, lost)
        assert rec is not None and rec.created_at == replacement.created_at  # the replacement runs on
        assert _kinds(settings, run_id, lost) == [ACTIVE, PREEMPTED, DELETE_REQUESTED, GONE, ACTIVE]
    finally:
        successor.release()
        first.release()
