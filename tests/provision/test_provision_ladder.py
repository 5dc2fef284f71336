"""The capacity ladder against the fake Cloud TPU API, over HTTP through google-cloud-tpu."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from tpu_ops.cloud.tpu import TpuApi
from tpu_ops.errors import BudgetError, ProvisioningError
from tpu_ops.provision import Outcome, provision, slice_for, teardown
from tpu_ops.provision.ledger import Ledger
from tpu_ops.provision.prices import shipped
from tpu_ops.provision.providers.tpu_api import TpuApiProvider

ZA, ZB = "us-central2-a", "us-central2-b"


def test_reservation_full_then_spot_wins(fake: Any, settings: Any, spec_factory: Any) -> None:
    fake.capacity({ZA: {"reservations": {"res-a": 8}}})  # 8 chips reserved; v4-32 needs 16
    with slice_for(spec_factory(), "run-res-full", settings) as s:
        assert (s.tier, s.zone) == ("spot", ZA)
        assert [(a.tier, a.zone, a.outcome) for a in s.attempts] == [
            ("reservation", ZA, Outcome.STOCKOUT),
            ("spot", ZA, Outcome.ACTIVE),
        ]
        assert s.hosts == 4 and len(s.endpoints) == 4 and s.chips == 16
        assert s.queued_resource == "run-res-full-a2"
        state = fake.state()
        assert state["queued_resources"] == 1, state  # the abandoned request was deleted
    assert fake.state()["nodes"] == 0


def test_reservation_has_room(fake: Any, settings: Any, spec_factory: Any) -> None:
    fake.capacity({ZA: {"reservations": {"res-a": 16}}})
    with slice_for(spec_factory(), "run-res-ok", settings) as s:
        assert (s.tier, s.zone, len(s.attempts)) == ("reservation", ZA, 1)


def test_spot_stockout_in_zone_a_moves_to_zone_b(fake: Any, settings: Any, spec_factory: Any) -> None:
    fake.capacity({ZA: {"spot": 0}, ZB: {"spot": 4096}})
    spec = spec_factory(ladder=["spot", "on-demand"])
    with slice_for(spec, "run-zone-b", settings) as s:
        assert (s.tier, s.zone) == ("spot", ZB)
        assert [(a.zone, a.outcome) for a in s.attempts] == [(ZA, Outcome.STOCKOUT), (ZB, Outcome.ACTIVE)]
        assert s.attempts[0].seconds_waited >= 1.0  # it waited out validUntilDuration (1s)


def test_every_rung_exhausted_lists_each_attempt(fake: Any, settings: Any, spec_factory: Any) -> None:
    empty = {"spot": 0, "on-demand": 0, "reservations": {"res-a": 0}}
    fake.capacity({ZA: empty, ZB: {"spot": 0, "on-demand": 0}})
    with pytest.raises(ProvisioningError) as info:
        provision(spec_factory(), "run-none", settings)
    attempts = info.value.attempts
    assert [(a.tier, a.zone) for a in attempts] == [
        ("reservation", ZA),
        ("spot", ZA),
        ("spot", ZB),
        ("on-demand", ZA),
        ("on-demand", ZB),
    ]
    assert {a.outcome for a in attempts} == {Outcome.STOCKOUT}
    text = str(info.value)
    for a in attempts:
        assert a.resource_id in text
    teardown("run-none", settings)  # abandoned requests were force-deleted; confirm they are gone


def test_429_503_storm_gives_one_slice(fake: Any, settings: Any, spec_factory: Any) -> None:
    # Every create, get, list and delete answers 503/429 a few times before it succeeds.
    fake.faults(
        {"path": "queuedResources", "status": 503, "count": 3, "method": "POST"},
        {"path": "queuedResources", "status": 429, "count": 3, "method": "GET"},
        {"path": "nodes", "status": 503, "count": 3, "method": "GET"},
        {"path": "queuedResources", "status": 503, "count": 3, "method": "DELETE"},
    )
    spec = spec_factory(ladder=["spot"])
    with slice_for(spec, "run-storm", settings) as s:
        state = fake.state()
        assert state["faults_pending"] == 3  # only the DELETE faults are left, for teardown
        assert state["queued_resources"] == 1 and state["nodes"] == 1, state
        assert s.tier == "spot" and len(s.attempts) == 1
    assert fake.state()["faults_pending"] == 0  # teardown went through the DELETE storm too


def test_create_that_landed_but_answered_503_is_not_duplicated(fake: Any, settings: Any, spec_factory: Any) -> None:
    api = TpuApi(settings)
    real_create = api.create_queued_resource
    calls: list[int] = []

    def flaky(zone: str, req: Any, request_id: str) -> Any:
        op = real_create(zone, req, request_id)  # it lands on the server...
        calls.append(1)
        if len(calls) == 1:  # ...but the first answer is lost
            from tpu_ops.errors import TransientError

            raise TransientError("lost response", service="tpu", status=503)
        return op

    api.create_queued_resource = flaky  # type: ignore[method-assign]
    with slice_for(spec_factory(ladder=["spot"]), "run-lost", settings, provider=TpuApiProvider(settings, api)) as s:
        assert len(calls) == 1  # the retry saw the request existed and did not create again
        assert fake.state()["queued_resources"] == 1
        assert s.queued_resource == "run-lost-a1"


def test_rerun_same_run_id_adopts_the_same_slice(fake: Any, settings: Any, spec_factory: Any) -> None:
    spec = spec_factory(ladder=["spot"])
    try:
        first = provision(spec, "run-again", settings)
        second = provision(spec, "run-again", settings)
        assert (second.queued_resource, second.node, second.zone) == (first.queued_resource, first.node, first.zone)
        assert second.attempts[-1].outcome == Outcome.ADOPTED
        assert fake.state()["queued_resources"] == 1 and fake.state()["nodes"] == 1
    finally:
        teardown("run-again", settings)


def test_over_budget_is_refused_before_any_create(fake: Any, settings: Any, spec_factory: Any) -> None:
    # A trap: if a create reached the server, this fault would be consumed.
    fake.faults({"path": "queuedResources", "status": 500, "count": 1, "method": "POST"})
    spec = spec_factory(budget_usd=10, hours=2)  # 16 chips x 2 h x $3.22 = $103.04 on-demand
    with pytest.raises(BudgetError) as info:
        provision(spec, "run-broke", settings)
    assert info.value.budget_usd == 10
    assert info.value.estimate_usd == pytest.approx(16 * 2 * shipped().price("v4", "on-demand"))
    assert "$103.04" in str(info.value) and "$10.00" in str(info.value)
    state = fake.state()
    assert state["faults_pending"] == 1 and state["operations"] == 0 and state["queued_resources"] == 0


def test_preempted_slice_is_deleted_and_recreated(fake: Any, settings: Any, spec_factory: Any) -> None:
    spec = spec_factory(ladder=["spot"])
    fake.latency(delete_s=0.3)  # deleting takes a while, and the ledger bills that time
    try:
        first = provision(spec, "run-pre", settings)
        fake.preempt(first.zone, first.node)
        assert set(fake.state()["queued_resource_states"].values()) == {"SUSPENDED"}
        with pytest.raises(ProvisioningError, match="recreate"):
            provision(spec, "run-pre", settings, recreate=False)
        assert fake.state()["queued_resources"] == 0  # force-deleted even when not recreating
        second = provision(spec, "run-pre", settings)
        assert second.node == first.node  # same deterministic id, a new slice
        states = fake.state()["node_states"]
        assert list(states.values()) == ["READY"], states
    finally:
        teardown("run-pre", settings)
    cost = Ledger(settings, "run-pre").summary(shipped())
    assert cost.open_slices == 0 and len(cost.slices) == 2
    # two deletions (the preempted slice's, then teardown's) of 16 chips, each at least ~0.3 s
    assert 2 * 16 * 0.25 / 3600 <= cost.chip_hours_by_phase["deleting"] < 2 * 16 * 30 / 3600


def test_slice_for_tears_down_on_error(fake: Any, settings: Any, spec_factory: Any) -> None:
    with pytest.raises(RuntimeError), slice_for(spec_factory(ladder=["spot"]), "run-boom", settings):
        assert fake.state()["nodes"] == 1
        raise RuntimeError("training blew up")
    assert fake.state()["nodes"] == 0 and fake.state()["queued_resources"] == 0


def test_teardown_is_idempotent_and_waits_for_deletion(fake: Any, settings: Any, spec_factory: Any) -> None:
    fake.latency(delete_s=0.3)
    provision(spec_factory(ladder=["spot"]), "run-slow-del", settings)
    report = teardown("run-slow-del", settings)
    assert report.confirmed_gone and {r.kind for r in report.deleted} == {"queued-resource", "node"}
    assert report.seconds >= 0.25
    assert fake.state()["nodes"] == 0
    assert teardown("run-slow-del", settings).deleted == []


def test_overall_timeout_stops_the_ladder(fake: Any, settings: Any, spec_factory: Any) -> None:
    fake.capacity({ZA: {"spot": 0}, ZB: {"spot": 0}})
    spec = spec_factory(ladder=["spot"], queue_timeout="30s", overall_timeout="1s")
    done = threading.Event()
    with pytest.raises(ProvisioningError) as info:
        provision(spec, "run-slow", settings)
    done.set()
    outcomes = [a.outcome for a in info.value.attempts]
    assert outcomes == [Outcome.TIMEOUT, Outcome.TIMEOUT]
    teardown("run-slow", settings)


def test_quota_exhausted_in_zone_a_moves_to_zone_b(fake: Any, settings: Any, spec_factory: Any) -> None:
    fake.faults(
        {
            "path": f"locations/{ZA}/queuedResources$",
            "status": 429,
            "count": 1,
            "method": "POST",
            "message": "Quota limit 'TPUV4PodPerProjectPerZone' exceeded",
        }
    )
    with slice_for(spec_factory(ladder=["spot"]), "run-quota-b", settings) as s:
        assert [(a.zone, a.outcome) for a in s.attempts] == [(ZA, Outcome.QUOTA), (ZB, Outcome.ACTIVE)]
        assert "Quota limit" in s.attempts[0].detail


def test_error_translation_for_creates() -> None:
    from google.api_core import exceptions as gexc

    from tpu_ops.errors import CapacityError, QuotaError, TransientError

    quota = TpuApi._create_error(gexc.TooManyRequests("Quota exceeded for chips"), ZA, "spot")
    assert isinstance(quota, QuotaError) and (quota.zone, quota.tier) == (ZA, "spot")
    assert isinstance(TpuApi._create_error(gexc.TooManyRequests("slow down"), ZA, "spot"), TransientError)
    assert isinstance(TpuApi._create_error(gexc.ServiceUnavailable("busy"), ZA, "spot"), TransientError)
    stock = TpuApi._create_error(gexc.ResourceExhausted("no capacity"), ZB, "on-demand")  # an operation error
    assert type(stock) is CapacityError and stock.zone == ZB


def test_rerun_with_another_accelerator_refuses_to_adopt(fake: Any, settings: Any, spec_factory: Any) -> None:
    spec = spec_factory(ladder=["spot"])
    try:
        provision(spec, "run-shape", settings)
        other = spec_factory(ladder=["spot"], slice={**spec.slice.model_dump(), "accelerator_type": "v4-8"})
        with pytest.raises(ProvisioningError, match="already has a v4-32 slice"):
            provision(other, "run-shape", settings)
        assert fake.state()["nodes"] == 1
    finally:
        teardown("run-shape", settings)


def test_rerun_after_a_failed_request_cleans_it_and_carries_on(fake: Any, settings: Any, spec_factory: Any) -> None:
    fake.capacity({ZA: {"spot": 0}, ZB: {"spot": 0}})
    spec = spec_factory(ladder=["spot"])
    with pytest.raises(ProvisioningError):
        provision(spec, "run-retry", settings)
    fake.capacity({ZA: {"spot": 4096}})
    with slice_for(spec, "run-retry", settings, recreate=False) as s:  # leftovers are not "dead slices"
        assert (s.zone, s.queued_resource) == (ZA, "run-retry-a1")


def test_reservation_paths(settings: Any, fake: Any) -> None:
    api = TpuApi(settings)
    assert api.reservation_path(ZA, "res-a") == f"projects/tpu-ops-local/locations/{ZA}/reservations/res-a"
    shared = "projects/other-proj/zones/us-central2-a/reservations/big"
    assert api.reservation_path(ZA, shared) == "projects/other-proj/locations/us-central2-a/reservations/big"


def test_a_rerun_adopts_a_request_still_waiting_in_the_queue(fake: Any, settings: Any, spec_factory: Any) -> None:
    """An earlier process left attempt #2 waiting in zone b; zone a now has room. The re-run keeps
    waiting on #2 (and the ladder goes on from there) instead of starting over in zone a, which
    would leave the run holding two requests."""
    from tpu_ops.cloud.tpu import QueuedResourceRequest
    from tpu_ops.provision.naming import run_labels
    from tpu_ops.tiers import Tier

    spec = spec_factory(ladder=["spot"])
    fake.capacity({ZB: {"spot": 0}})  # zone a keeps its (default) capacity
    api = TpuApi(settings)
    left = QueuedResourceRequest("run-wait-a2", "run-wait-a2", "v4-32", spec.slice.runtime, Tier.SPOT, 60,
                                 labels=run_labels("run-wait", Tier.SPOT, 2))  # fmt: skip
    api.create_queued_resource(ZB, left, "earlier-process")
    try:
        with pytest.raises(ProvisioningError) as info:
            provision(spec, "run-wait", settings)
        assert [(a.number, a.zone, a.outcome) for a in info.value.attempts] == [(2, ZB, Outcome.TIMEOUT)]
        created = {k.rsplit("/", 1)[-1] for k in fake.state()["queued_resource_states"]}
        assert "run-wait-a1" not in created
    finally:
        teardown("run-wait", settings)
