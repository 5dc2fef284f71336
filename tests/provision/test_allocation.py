"""An allocation of k slices on the Cloud TPU API: ONE multislice queued resource (Google's node count),
granted whole or not at all, each node billed as its own slice; Google's repair of a lost slice seen through
the provider. (The partial hold of an allocation gathered slice by slice is Compute Engine's:
tests/provision/test_compute_tiers.py.)"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

from tpu_ops.cloud.tpu import TpuApi
from tpu_ops.errors import ProvisioningError
from tpu_ops.provision import teardown
from tpu_ops.provision.allocation import PARTIAL
from tpu_ops.provision.lease import SliceLease
from tpu_ops.provision.ledger import ACTIVE, GONE, Ledger
from tpu_ops.provision.naming import slice_of
from tpu_ops.provision.prices import shipped
from tpu_ops.provision.providers import Phase
from tpu_ops.specs.slice import SliceSpec
from tpu_ops.train.keeper import Keeper

ZA, ZB = "us-central2-a", "us-central2-b"


def _two(spec_factory: Any, **kw: Any) -> Any:
    spec = spec_factory(ladder=["spot", "on-demand"], **kw)
    return spec.model_copy(update={"slice": spec.slice.model_copy(update={"slices": 2})})


def test_two_slices_are_one_queued_resource_with_a_node_per_slice(fake: Any, settings: Any, spec_factory: Any) -> None:
    fake.capacity({ZA: {"spot": 32, "on-demand": 0}, ZB: {"spot": 4096}})
    lease = SliceLease(_two(spec_factory), "run-ms-ok", settings)
    try:
        alloc = lease.gather(lambda i: {"tpu-ops-slice": str(i), "startup-script": "true"})
        assert [s.queued_resource for s in alloc.slices] == ["run-ms-ok-a1-0", "run-ms-ok-a1-1"]
        assert [slice_of("run-ms-ok", s.queued_resource) for s in alloc.slices] == [0, 1]
        assert {s.zone for s in alloc.slices} == {ZA} and alloc.hosts == 8 and alloc.chips == 32
        doc = alloc.document("inc-1")
        assert [len(s["endpoints"]) for s in doc["slices"]] == [4, 4] and doc["incarnation"] == "inc-1"
        state = fake.state()
        assert (state["queued_resources"], state["nodes"]) == (1, 2)  # one request for both slices
        api = TpuApi(settings)
        (qr,) = api.list_queued_resources(ZA)
        assert (qr.qr_id, qr.node_count, qr.node_ids) == ("run-ms-ok-a1", 2, ("run-ms-ok-a1-0", "run-ms-ok-a1-1"))
        nodes = {n.node_id: n for n in api.list_nodes(ZA)}
        # one node spec, one metadata for both nodes: no per-slice key (the agent reads MEGASCALE_SLICE_ID)
        raw = api.client.get_node(name=api.node_name(ZA, "run-ms-ok-a1-1"))
        assert "tpu-ops-slice" not in raw.metadata and raw.metadata["startup-script"] == "true"
        assert set(nodes) == {"run-ms-ok-a1-0", "run-ms-ok-a1-1"}
        opened = [e for e in Ledger(settings, "run-ms-ok").events() if e["kind"] == ACTIVE]
        assert sorted((e["resource_id"], e["chips"]) for e in opened) == [
            ("run-ms-ok-a1-0", 16),
            ("run-ms-ok-a1-1", 16),
        ]
    finally:
        lease.release()
    assert fake.state()["nodes"] == 0 and fake.state()["queued_resources"] == 0
    closed = [e["resource_id"] for e in Ledger(settings, "run-ms-ok").events() if e["kind"] == GONE]
    assert {"run-ms-ok-a1-0", "run-ms-ok-a1-1"} <= set(closed)  # teardown closes each slice's bill


def test_one_slice_short_the_request_waits_whole_and_nothing_is_held(
    fake: Any, settings: Any, spec_factory: Any
) -> None:
    # Room for one v4-32 (16 chips) in each zone, never two: Google grants a multislice whole or not at all.
    fake.capacity({ZA: {"spot": 16, "on-demand": 0}, ZB: {"spot": 16, "on-demand": 0}})
    seen: list[int] = []
    lease = SliceLease(
        _two(spec_factory), "run-ms-short", settings, on_attempt=lambda a: seen.append(fake.state()["nodes"])
    )
    with pytest.raises(ProvisioningError, match="every rung failed") as info:
        lease.gather()
    attempts = info.value.attempts
    assert len(attempts) == 4 and {a.outcome for a in attempts} <= {"stockout", "timeout"}  # each waited whole
    assert {a.resource_id for a in attempts} == {f"run-ms-short-a{n}" for n in (1, 2, 3, 4)}
    assert seen == [0, 0, 0, 0]  # no node of the request ever existed
    events = Ledger(settings, "run-ms-short").events()
    assert not [e for e in events if e["kind"] in (ACTIVE, PARTIAL)]  # nothing held, so nothing billed
    assert Ledger(settings, "run-ms-short").summary(shipped()).usd_total == 0
    teardown("run-ms-short", settings)


def test_a_lost_slice_is_lost_alone_while_google_repairs_it(
    fake: Any, settings: Any, spec_factory: Any, waiter: Any
) -> None:
    fake.capacity({ZA: {"spot": 32, "on-demand": 0}, ZB: {"spot": 0, "on-demand": 0}})
    lease = SliceLease(_two(spec_factory), "run-ms-rep", settings)
    try:
        alloc = lease.gather()
        lost = alloc.slices[1]
        fake.capacity({ZA: {"spot": 16}})  # the lost slice's hardware is gone for now: the repair waits
        fake.preempt(ZA, lost.queued_resource)
        p = lease.provider
        assert p.describe(ZA, lost.queued_resource).state == Phase.LOST  # the slice alone is lost
        assert p.describe(ZA, alloc.slices[0].queued_resource).state == Phase.RUNNING  # the other is not
        whole = p.describe(ZA, "run-ms-rep-a1")
        assert whole.state == Phase.BOOTING and "repairing run-ms-rep-a1-1" in whole.raw_state  # the request waits
        fake.capacity({ZA: {"spot": 32}})
        back = waiter(lambda: (r := p.describe(ZA, lost.queued_resource)).state == Phase.RUNNING and r, what="repair")
        assert back.created_at != lost.created_at  # a new node of the same name
        assert p.describe(ZA, "run-ms-rep-a1").state == Phase.RUNNING
    finally:
        lease.release()


@contextlib.contextmanager
def _keeper(fake: Any, settings: Any, spec_factory: Any, run_id: str, keep: str) -> Iterator[Keeper]:
    """A keeper of a 2-slice request gathered from spot in zone a (keep_healthy_for ``keep``); released after."""
    fake.capacity({ZA: {"spot": 32, "on-demand": 0}, ZB: {"spot": 0, "on-demand": 0}})
    lease = SliceLease(_two(spec_factory), run_id, settings)
    try:
        spec = SliceSpec.model_validate({**lease.spec.slice.model_dump(), "keep_healthy_for": keep})
        keeper = Keeper(lease, spec, None, None, Ledger(settings, run_id))  # type: ignore[arg-type]  # gcs, layout
        keeper.slices = lease.gather().slices
        yield keeper
    finally:
        lease.release()


def test_the_keeper_waits_for_googles_repair_and_keeps_the_whole_request(
    fake: Any, settings: Any, spec_factory: Any
) -> None:
    with _keeper(fake, settings, spec_factory, "run-ms-keep", "2m") as keeper:
        fake.preempt(ZA, "run-ms-keep-a1-1")
        keeper.give_back(1)  # returns once the repaired node runs
        assert keeper.kept == (0, 1)  # every node of the request runs on: nothing deleted
        rec = keeper.lease.provider.describe(ZA, "run-ms-keep-a1-1")
        assert rec.state == Phase.RUNNING and rec.created_at != keeper.slices[1].created_at
        assert fake.state()["queued_resources"] == 1
        events = [(e["kind"], e.get("resource_id")) for e in Ledger(settings, "run-ms-keep").events()]
        assert ("gone", "run-ms-keep-a1-1") in events and ("gone", "run-ms-keep-a1-0") not in events
        assert ("delete-requested", "run-ms-keep-a1-1") not in events  # Google replaced it; tpu-ops deleted nothing


def test_no_repair_within_keep_healthy_for_gives_the_whole_request_back(
    fake: Any, settings: Any, spec_factory: Any
) -> None:
    with _keeper(fake, settings, spec_factory, "run-ms-drop", "2s") as keeper:
        fake.capacity({ZA: {"spot": 16}})  # no hardware for the lost slice: Google's repair waits
        fake.preempt(ZA, "run-ms-drop-a1-0")
        keeper.give_back(0)
        assert keeper.kept == ()  # a whole new allocation comes next
        state = fake.state()
        assert (state["queued_resources"], state["nodes"]) == (0, 0)  # the request and the healthy node are gone
