"""A supervisor taking over a run whose slice was lost while none ran (``Keeper.adopt``), on the fake TPU API:
the incarnation's slices are held again only when the lost one is named, every other one still runs and its
workers have not exited, and ``keep_healthy_for`` allows it; then Google's repair of the lost node is waited
for as a live supervisor waits. Otherwise nothing is held, and ``give_back`` deletes everything, as before.
(The same on Compute Engine, end to end: tests/train/test_takeover.py.)"""

from __future__ import annotations

from typing import Any

import pytest

from tpu_ops.provision.lease import SliceLease
from tpu_ops.provision.ledger import ACTIVE, DELETE_REQUESTED, GONE, PREEMPTED, Ledger
from tpu_ops.provision.providers import Phase
from tpu_ops.specs.slice import SliceSpec
from tpu_ops.train.keeper import Keeper
from tpu_ops.train.runstate import SliceState as Recorded

ZA = "us-central2-a"


def _successor(fake: Any, settings: Any, spec_factory: Any, run_id: str, keep: str) -> tuple[Keeper, list[Recorded]]:
    """A 2-slice request gathered by a first lease; a new lease and keeper (the successor's) that hold nothing,
    and the slices as the run state recorded them."""
    fake.capacity({ZA: {"spot": 32, "on-demand": 0}, "us-central2-b": {"spot": 0, "on-demand": 0}})
    spec = spec_factory(ladder=["spot", "on-demand"])
    sl = SliceSpec.model_validate({**spec.slice.model_dump(), "slices": 2, "keep_healthy_for": keep})
    spec = spec.model_copy(update={"slice": sl})
    first = SliceLease(spec, run_id, settings).gather().slices
    recorded = [Recorded(i, s.queued_resource, s.zone, s.tier, s.hosts) for i, s in enumerate(first)]
    lease = SliceLease(spec, run_id, settings)
    keeper = Keeper(lease, sl, None, None, Ledger(settings, run_id))  # type: ignore[arg-type]  # gcs, layout
    return keeper, recorded


def test_a_named_lost_node_with_the_other_running_is_kept_and_googles_repair_awaited(
    fake: Any, settings: Any, spec_factory: Any
) -> None:
    keeper, recorded = _successor(fake, settings, spec_factory, "run-to-keep", "2m")
    try:
        created = keeper.lease.provider.describe(ZA, "run-to-keep-a1-1").created_at
        fake.preempt(ZA, "run-to-keep-a1-1")
        assert keeper.adopt(recorded, 1, exited={1})  # the lost slice's workers exited: that is no reason
        assert [s.queued_resource for s in keeper.slices] == ["run-to-keep-a1-0", "run-to-keep-a1-1"]
        assert keeper.slices[1].created_at == created  # the lost node as it was: its repair is a new one
        keeper.give_back(1)  # returns once Google's new node runs
        assert keeper.kept == (0, 1) and fake.state()["queued_resources"] == 1
        events = [(e["kind"], e.get("resource_id")) for e in Ledger(settings, "run-to-keep").events()]
        assert events.count((ACTIVE, "run-to-keep-a1-0")) == 1  # adopted, not opened a second time
        assert (GONE, "run-to-keep-a1-1") in events and (GONE, "run-to-keep-a1-0") not in events
        assert (DELETE_REQUESTED, "run-to-keep-a1-1") not in events  # Google replaced it; tpu-ops deleted nothing
    finally:
        keeper.lease.release()


@pytest.mark.parametrize(
    ("case", "keep", "lost", "exited"),
    [
        ("lost slice not known", "2m", None, ()),
        ("the other slice lost too", "2m", 1, ()),
        ("the other slice's workers exited", "2m", 1, (0,)),
        ("keep_healthy_for 0", "0s", 1, ()),
    ],
)
def test_otherwise_nothing_is_held_and_everything_is_given_back(
    fake: Any, settings: Any, spec_factory: Any, case: str, keep: str, lost: int | None, exited: tuple[int, ...]
) -> None:
    run_id = f"run-to-drop-{len(case)}"
    keeper, recorded = _successor(fake, settings, spec_factory, run_id, keep)
    try:
        fake.capacity({ZA: {"spot": 0}})  # no hardware for a repair: Google's would wait
        fake.preempt(ZA, f"{run_id}-a1-1")
        if case == "the other slice lost too":
            fake.preempt(ZA, f"{run_id}-a1-0")
        assert not keeper.adopt(recorded, lost, exited) and keeper.slices == ()
        keeper.give_back(lost)
        assert keeper.kept == ()
        state = fake.state()
        assert (state["queued_resources"], state["nodes"]) == (0, 0)  # the request and every node deleted
        closed = [e["resource_id"] for e in Ledger(settings, run_id).events() if e["kind"] == GONE]
        assert [closed.count(f"{run_id}-a1-{i}") for i in (0, 1)] == [1, 1]  # each node's bill closed once
    finally:
        keeper.lease.release()


def test_a_node_google_repaired_before_the_successor_looked_is_taken_as_repaired(
    fake: Any, settings: Any, spec_factory: Any, waiter: Any
) -> None:
    keeper, recorded = _successor(fake, settings, spec_factory, "run-to-fixed", "2s")
    try:
        p = keeper.lease.provider
        created = p.describe(ZA, "run-to-fixed-a1-1").created_at
        fake.preempt(ZA, "run-to-fixed-a1-1")
        waiter(lambda: (r := p.describe(ZA, "run-to-fixed-a1-1")).state == Phase.RUNNING and r.created_at != created,
               what="Google's repair")  # fmt: skip
        waiter(lambda: p.describe(ZA, "run-to-fixed-a1").state == Phase.RUNNING, what="the request whole again")
        assert keeper.adopt(recorded, 1)  # a notice named node 1 lost; it is already back, a new node
        keeper.give_back(1)  # not waiting 2 s for a newer node than the repaired one: kept at once
        assert keeper.kept == (0, 1) and fake.state()["queued_resources"] == 1
    finally:
        keeper.lease.release()


def test_a_supervisor_killed_awaiting_googles_repair_is_succeeded_by_one_that_closes_the_bill_once(
    fake: Any, settings: Any, spec_factory: Any
) -> None:
    """Killed mid-recovery on the TPU API: the lost node's bill closed (Google stops billing its chips), its repair
    awaited. The successor awaits it as well, keeping the request, and does not close that bill a second time."""
    keeper, recorded = _successor(fake, settings, spec_factory, "run-to-await", "2m")
    try:
        fake.preempt(ZA, "run-to-await-a1-1")
        ledger = Ledger(settings, "run-to-await")  # what the predecessor wrote before it died
        ledger.append(PREEMPTED, resource_id="run-to-await-a1-1", zone=ZA)
        ledger.append(GONE, resource_id="run-to-await-a1-1", zone=ZA)
        assert keeper.adopt(recorded, 1)
        keeper.give_back(1)
        assert keeper.kept == (0, 1) and fake.state()["queued_resources"] == 1  # the request kept, repaired
        kinds = [e["kind"] for e in ledger.events() if e.get("resource_id") == "run-to-await-a1-1"]
        assert kinds == [ACTIVE, PREEMPTED, GONE], kinds  # nothing asked deleted, the bill closed once
    finally:
        keeper.lease.release()
