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


@pytest.mark.parametrize("accelerator", ["v5p-8", "v5p-16"])
@pytest.mark.parametrize("request_left", [True, False], ids=["delete-under-way", "killed-before-asking"])
def test_a_successor_waits_for_the_delete_under_way_and_asks_only_when_none_is(
    compute: Any, compute_url: str, tmp_path: Path, google_auth: Any, fakes: Any, accelerator: str, request_left: bool
) -> None:
    run_id = f"midkill-{accelerator[-1]}-{int(request_left)}"
    settings = fakes.settings(tmp_path, google_auth, compute_endpoint=compute_url)
    spec = fakes.slice_request(["spot"], accelerator, "us-east5", [ZONE], "compute")
    sl = SliceSpec.model_validate({**spec.slice.model_dump(), "slices": 2, "keep_healthy_for": "2m"})
    spec = spec.model_copy(update={"slice": sl})
    first = SliceLease(spec, run_id, settings)
    s0, s1 = first.gather().slices
    lost = s1.queued_resource
    successor = SliceLease(spec, run_id, settings)
    try:
        host = sorted(n.rsplit("/", 1)[-1] for n in compute("GET", "/_fake/state")["instance_states"] if lost in n)[0]
        compute("POST", f"/_fake/zones/{ZONE}/instances/{host}:preempt")
        # The predecessor, killed mid-recovery: the loss recorded, the lost slice's delete in the ledger and
        # (request_left) asked of Compute Engine, not yet gone.
        ledger = Ledger(settings, run_id)
        ledger.append(PREEMPTED, resource_id=lost, zone=ZONE)
        ledger.append(DELETE_REQUESTED, resource_id=lost, zone=ZONE)
        if request_left:
            first.provider.request_delete(first.provider.slice_resources(ZONE, lost))
            assert first.provider.describe(ZONE, lost) is not None  # still going when the successor starts
        keeper = Keeper(successor, sl, None, None, Ledger(settings, run_id))  # type: ignore[arg-type]  # gcs, layout
        recorded = [Recorded(i, s.queued_resource, s.zone, s.tier, s.hosts) for i, s in enumerate((s0, s1))]
        assert keeper.adopt(recorded, 1)
        keeper.give_back(1)
        assert keeper.kept == (0,)
        # returned once the slice went (GONE is when the bill stops), every part of it: a group's template and
        # policy too; Compute Engine asked once for its delete
        assert [r.resource_id for r in successor.provider.resources([ZONE], run_id) if lost in r.resource_id] == []
        assert _deletes(successor.provider, lost) == 1
        assert successor.provider.describe(ZONE, s0.queued_resource) is not None  # the healthy slice kept
        assert _kinds(settings, run_id, lost) == [ACTIVE, PREEMPTED, DELETE_REQUESTED, GONE]  # its bill closed once
    finally:
        successor.release()
        first.release()
