"""Elastic shapes against the fake Cloud TPU API: the target first, a smaller shape only when the target
cannot be had (and the ledger says so), the target again at the next allocation."""

from __future__ import annotations

from typing import Any

import pytest

from tpu_ops.errors import ProvisioningError
from tpu_ops.provision.lease import SliceLease
from tpu_ops.provision.ledger import Ledger
from tpu_ops.provision.shapes import SHAPE, SHAPE_UNAVAILABLE, gather_shapes

ZA, ZB = "us-central2-a", "us-central2-b"


def _elastic(spec_factory: Any) -> Any:
    return spec_factory(
        slice={"accelerator_type": "v4-32", "region": "us-central2", "zones": [ZA, ZB], "shapes": ["v4-32", "v4-16"]},
        ladder=["spot", "on-demand"],
    )


def _gather(lease: SliceLease, settings: Any) -> tuple[Any, Any]:
    return gather_shapes(lease.spec, lease.gather, lambda count: lambda i: {}, Ledger(settings, lease.run_id))


def _shape_events(settings: Any, run_id: str) -> list[dict[str, Any]]:
    return [e for e in Ledger(settings, run_id).events() if e["kind"] in (SHAPE, SHAPE_UNAVAILABLE)]


def test_the_target_when_it_can_be_had(fake: Any, settings: Any, spec_factory: Any) -> None:
    fake.capacity({ZA: {"spot": 64, "on-demand": 0}, ZB: {"spot": 0, "on-demand": 0}})
    lease = SliceLease(_elastic(spec_factory), "run-shape-target", settings)
    try:
        alloc, shape = _gather(lease, settings)
        assert shape.name == "v4-32" and alloc.chips == 16 and alloc.slices[0].accelerator_type == "v4-32"
    finally:
        lease.release()
    (e,) = _shape_events(settings, "run-shape-target")
    assert (e["kind"], e["shape"], e["accum_steps"], e["why"]) == (SHAPE, "v4-32", 1, "the target shape")


def test_a_smaller_shape_only_when_the_target_is_stocked_out_then_the_target_again(
    fake: Any, settings: Any, spec_factory: Any
) -> None:
    # room for a v4-16 (8 chips) but not a v4-32 (16), in every zone and tier
    fake.capacity({ZA: {"spot": 8, "on-demand": 8}, ZB: {"spot": 8, "on-demand": 8}})
    lease = SliceLease(_elastic(spec_factory), "run-shape-fall", settings)
    try:
        alloc, shape = _gather(lease, settings)
        assert shape.name == "v4-16" and alloc.chips == 8 and alloc.hosts == 2
        assert alloc.slices[0].accelerator_type == "v4-16"
        lease.release()  # a recovery: the capacity came back, and the target is asked for first
        fake.capacity({ZA: {"spot": 64, "on-demand": 64}})
        alloc, shape = _gather(lease, settings)
        assert shape.name == "v4-32" and alloc.chips == 16
    finally:
        lease.release()
    events = _shape_events(settings, "run-shape-fall")
    assert [(e["kind"], e["shape"]) for e in events] == [
        (SHAPE_UNAVAILABLE, "v4-32"),
        (SHAPE, "v4-16"),
        (SHAPE, "v4-32"),
    ]
    assert events[0]["next"] == "v4-16" and "no slice of v4-32" in events[0]["reason"]
    assert events[1]["accum_steps"] == 2 and events[1]["target_chips"] == 16 and events[1]["chips"] == 8
    assert events[1]["why"] == "the target v4-32 could not be had" and events[1]["unavailable"] == ["v4-32"]


def test_no_shape_at_all_names_every_shape(fake: Any, settings: Any, spec_factory: Any) -> None:
    fake.capacity({ZA: {"spot": 0, "on-demand": 0}, ZB: {"spot": 0, "on-demand": 0}})
    lease = SliceLease(_elastic(spec_factory), "run-shape-none", settings)
    try:
        with pytest.raises(ProvisioningError, match=r"no shape of \['v4-32', 'v4-16'\]") as info:
            _gather(lease, settings)
        assert {a.outcome for a in info.value.attempts} <= {"stockout", "timeout"} and len(info.value.attempts) == 8
    finally:
        lease.release()


def test_a_successor_adopts_a_live_smaller_allocation(fake: Any, settings: Any, spec_factory: Any) -> None:
    from tpu_ops.provision.providers import SliceState

    fake.capacity({ZA: {"spot": 8, "on-demand": 8}, ZB: {"spot": 8, "on-demand": 8}})
    lease = SliceLease(_elastic(spec_factory), "run-shape-adopt", settings)
    try:
        first, _ = _gather(lease, settings)
        fake.capacity({ZA: {"spot": 64, "on-demand": 64}})  # the target could be had now, but the run is training

        def live() -> list[str]:
            found = lease.provider.slices([ZA, ZB], lease.run_id)
            return [r.accelerator_type for r in found if r.state in SliceState.RUNNING]

        ledger = Ledger(settings, lease.run_id)
        alloc, shape = gather_shapes(lease.spec, lease.gather, lambda count: lambda i: {}, ledger, live)
        assert shape.name == "v4-16" and alloc.slices[0].queued_resource == first.slices[0].queued_resource
    finally:
        lease.release()
    last = _shape_events(settings, "run-shape-adopt")[-1]
    assert (last["kind"], last["shape"]) == (SHAPE, "v4-16") and last["why"].startswith("the run's live allocation")
