"""An allocation of k slices against the fake Cloud TPU API: all k or none, in one zone, the partial hold billed."""

from __future__ import annotations

from typing import Any

import pytest

from tpu_ops.errors import ProvisioningError
from tpu_ops.provision import teardown
from tpu_ops.provision.allocation import PARTIAL
from tpu_ops.provision.lease import SliceLease
from tpu_ops.provision.ledger import Ledger
from tpu_ops.provision.naming import attempt_of, slice_of
from tpu_ops.provision.prices import shipped

ZA, ZB = "us-central2-a", "us-central2-b"


def _two(spec_factory: Any, **kw: Any) -> Any:
    spec = spec_factory(ladder=["spot", "on-demand"], **kw)
    return spec.model_copy(update={"slice": spec.slice.model_copy(update={"slices": 2})})


def test_two_slices_in_one_zone_each_with_its_own_ids(fake: Any, settings: Any, spec_factory: Any) -> None:
    fake.capacity({ZA: {"spot": 32, "on-demand": 0}, ZB: {"spot": 4096}})
    lease = SliceLease(_two(spec_factory), "run-ms-ok", settings)
    try:
        alloc = lease.gather(lambda i: {"tpu-ops-slice": str(i)})
        assert [s.queued_resource for s in alloc.slices] == ["run-ms-ok-a1", "run-ms-ok-a1001"]
        assert [slice_of("run-ms-ok", s.queued_resource) for s in alloc.slices] == [0, 1]
        assert {s.zone for s in alloc.slices} == {ZA} and alloc.hosts == 8 and alloc.chips == 32
        doc = alloc.document("inc-1")
        assert [len(s["endpoints"]) for s in doc["slices"]] == [4, 4] and doc["incarnation"] == "inc-1"
        assert fake.state()["nodes"] == 2
    finally:
        lease.release()
    assert fake.state()["nodes"] == 0


def test_one_slice_stocked_out_gives_everything_back_with_the_hold_in_the_ledger(
    fake: Any, settings: Any, spec_factory: Any
) -> None:
    # Room for one v4-32 in zone a; zone b has plenty but an allocation lives in one zone.
    fake.capacity({ZA: {"spot": 16, "on-demand": 0}, ZB: {"spot": 4096, "on-demand": 4096}})
    lease = SliceLease(_two(spec_factory), "run-ms-short", settings)
    with pytest.raises(ProvisioningError, match="allocation of 2 slices needs them all; slice 1") as info:
        lease.gather()
    attempts = info.value.attempts  # slice 1's: zone a only, cut at queue_timeout after slice 0 came
    assert attempts and {a.zone for a in attempts} == {ZA} and {a.outcome for a in attempts} <= {"stockout", "timeout"}
    assert fake.state()["nodes"] == 0 and fake.state()["queued_resources"] == 0  # everything given back
    events = Ledger(settings, "run-ms-short").events()
    partial = [e for e in events if e["kind"] == PARTIAL]
    assert len(partial) == 1 and partial[0]["slices"] == ["run-ms-short-a1"] and partial[0]["wanted"] == 2
    assert partial[0]["held_s"] >= 1.0  # slice 1 waited out the queue timeout (1s) while slice 0 was held
    kinds = [(e["kind"], e.get("resource_id")) for e in events if e.get("resource_id") == "run-ms-short-a1"]
    assert ("active", "run-ms-short-a1") in kinds and kinds[-1] == ("gone", "run-ms-short-a1")
    cost = Ledger(settings, "run-ms-short").summary(shipped())
    held = [c for c in cost.slices if c.resource_id == "run-ms-short-a1"]
    assert cost.usd_total > 0 and held[0].chip_hours > 0 and not held[0].open  # the hold is billed, and closed
    assert attempt_of("run-ms-short", "run-ms-short-a1001") == 1001
    teardown("run-ms-short", settings)
