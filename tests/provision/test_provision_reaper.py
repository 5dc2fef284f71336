"""The reaper in-process: which runs it reaps, what it leaves alone, what it reports."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from tpu_ops.cloud.tpu import TpuApi
from tpu_ops.provision import provision, recover, teardown
from tpu_ops.provision.ledger import Ledger
from tpu_ops.provision.prices import shipped
from tpu_ops.provision.reaper import reap

ZA = "us-central2-a"


@pytest.fixture
def two_runs(fake: Any, settings: Any, spec_factory: Any) -> Any:
    spec = spec_factory(ladder=["spot"])
    provision(spec, "run-live", settings)
    provision(spec, "run-done", settings)
    yield spec
    for run in ("run-live", "run-done"):
        teardown(run, settings)


def test_reaps_finished_and_unknown_runs_keeps_live_ones(fake: Any, settings: Any, two_runs: Any) -> None:
    states = {"run-live": True, "run-done": False}
    dry = reap(settings, run_state=states.get, dry_run=True)
    assert [(r.run_id, r.reason) for r in dry.reaped] == [("run-done", "its run is finished")]
    assert dry.kept == ["run-live"] and not dry.reaped[0].deleted
    assert fake.state()["nodes"] == 2

    report = reap(settings, run_state=lambda run: None if run == "run-live" else False)
    assert {r.run_id: r.reason for r in report.reaped} == {
        "run-done": "its run is finished",
        "run-live": "its run is unknown",
    }
    assert all(r.deleted for r in report.reaped) and fake.state()["nodes"] == 0
    kinds = sorted(x.kind for r in report.reaped for x in r.resources)
    assert kinds == ["node", "node", "queued-resource", "queued-resource"]
    assert report.cost_usd > 0


def test_without_a_judge_only_ttl_and_dead_owners_count(fake: Any, settings: Any, two_runs: Any) -> None:
    # The owner (this process) is alive and nobody says the runs are over: keep both.
    assert reap(settings).reaped == []
    report = reap(settings, ttl=timedelta(seconds=0))
    assert sorted(r.run_id for r in report.reaped) == ["run-done", "run-live"]
    assert all(r.reason.startswith("older than the TTL") for r in report.reaped)
    # Cost = age from the creation label x 16 chips x the spot price.
    hourly = 16 * shipped().price("v4", "spot")
    for r in report.reaped:
        assert 0 < r.cost_usd <= hourly * (r.age_hours + 0.01)
    assert fake.state()["nodes"] == 0


def test_leaves_resources_it_does_not_manage(fake: Any, settings: Any) -> None:
    from google.cloud import tpu_v2

    api = TpuApi(settings)
    parent = api.parent(ZA)
    node = tpu_v2.Node(accelerator_type="v4-8", runtime_version="tpu-ubuntu2204-base", labels={"team": "ml"})
    api.client.create_node(parent=parent, node_id="someone-elses", node=node).result(timeout=30)
    try:
        report = reap(settings, run_state=lambda run: False, ttl=timedelta(seconds=0))
        assert report.reaped == [] and fake.state()["nodes"] == 1
    finally:
        api.client.delete_node(name=api.node_name(ZA, "someone-elses")).result(timeout=30)


def test_recover_replaces_a_preempted_slice_and_the_ledger_bills_both(
    fake: Any, settings: Any, spec_factory: Any
) -> None:
    spec = spec_factory(ladder=["spot"])
    try:
        first = provision(spec, "run-rec", settings)
        assert recover(spec, "run-rec", settings).node == first.node  # healthy: the same slice
        fake.preempt(first.zone, first.node)
        second = recover(spec, "run-rec", settings)
        assert second.node == first.node and second.attempts[-1].outcome == "active"
        assert list(fake.state()["node_states"].values()) == ["READY"]
    finally:
        teardown("run-rec", settings)
    cost = Ledger(settings, "run-rec").summary(shipped())
    assert len(cost.slices) == 2 and cost.open_slices == 0
    assert cost.slices[0].hours["preempted"] > 0  # time spent preempted is billed
    assert set(cost.usd_by_tier) == {"spot"}


def test_a_slice_handed_to_the_user_is_kept_until_ttl_or_teardown(fake: Any, settings: Any, spec_factory: Any) -> None:
    s = provision(spec_factory(ladder=["spot"]), "run-mine", settings)
    Ledger(settings, "run-mine").hand_off(s.queued_resource)  # what `tpu-ops provision` records
    try:
        assert reap(settings, run_state=lambda run: False).reaped == []
        assert [r.run_id for r in reap(settings, run_state=lambda run: False, ttl=timedelta(0)).reaped] == ["run-mine"]
        assert fake.state()["nodes"] == 0
    finally:
        teardown("run-mine", settings)
    assert not Ledger(settings, "run-mine").handed_off()


def test_prefect_outage_keeps_runs(fake: Any, settings: Any, two_runs: Any) -> None:
    from flows.reaper import guarded

    def down(run_id: str) -> bool | None:
        raise ConnectionError("prefect API unreachable")

    assert reap(settings, run_state=guarded(down)).reaped == []
    assert fake.state()["nodes"] == 2


def test_reaper_deployment_is_scheduled() -> None:
    from flows.deployments import REAP_INTERVAL, deployments

    deps = {d.name: d for d in deployments()}
    reaper = deps["every-15-minutes"]
    assert reaper.schedules and reaper.schedules[0].schedule.interval == REAP_INTERVAL
    assert reaper.parameters == {"ttl_hours": 72.0}


def test_configured_zones_limit_what_the_reaper_scans(fake: Any, settings: Any, two_runs: Any) -> None:
    elsewhere = settings.model_copy(update={"tpu_zones": ["us-central2-b"]})
    assert reap(elsewhere, run_state=lambda run: False).reaped == []  # both slices are in zone a
    here = settings.model_copy(update={"tpu_zones": [ZA]})
    assert len(reap(here, run_state=lambda run: False).reaped) == 2


def test_prefect_lookup_says_live_finished_or_unknown(prefect_api: None) -> None:
    """The reaper's question to a real Prefect API: a run with any non-final flow run is live, a run
    whose flow runs are all final is finished, a run Prefect never saw is unknown."""
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.states import Completed, Failed, Running

    from flows.provision import run_tag
    from flows.reaper import guarded, prefect_run_state

    @flow(name="reaper-lookup")
    def noop() -> None:
        pass

    with get_client(sync_client=True) as client:
        for run_id, states in {"lk-live": [Completed(), Running()], "lk-done": [Completed(), Failed()]}.items():
            for state in states:
                fr = client.create_flow_run(noop, tags=[run_tag(run_id)])
                client.set_flow_run_state(fr.id, state, force=True)
    assert prefect_run_state("lk-live") is True
    assert prefect_run_state("lk-done") is False
    assert prefect_run_state("lk-never") is None
    assert guarded(prefect_run_state)("lk-done") is False  # the guard passes answers through
