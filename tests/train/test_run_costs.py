"""A run's cost wherever its GCS state can be read (``tpu_ops.train.costs``): the supervisor publishes its ledger's
billing events beside the run state; a reader in another state directory merges them with its own ledger.

Two state directories (A: the supervisor's machine, B: a shell elsewhere) on the session stack's fake GCS; the
last test supervises a real run with A (the reference trainer on the host simulator) and reads it from B.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from train_helpers import ZONE, Run, job_spec, wait_for

from flows.cli import main
from flows.commands.logs import summary
from flows.commands.status import detail
from tpu_ops.layout import RunLayout
from tpu_ops.provision import ledger as L
from tpu_ops.provision.prices import load as load_prices
from tpu_ops.train import costs, launches
from tpu_ops.train.launches import PREFECT, LaunchRecord
from tpu_ops.train.status import run_status
from tpu_ops.train.wheel import agent_wheel

RUN, T0 = "cost-elsewhere", 1_700_000_000.0


@pytest.fixture
def two(local_stack: Any, tmp_path: Path) -> tuple[Any, Any]:
    """Settings of machine A (the run's supervisor) and machine B (a shell elsewhere): one stack, two state dirs."""
    return local_stack.settings(state_dir=tmp_path / "A"), local_stack.settings(state_dir=tmp_path / "B")


def _active(ledger: L.Ledger) -> None:
    ledger.append(L.ATTEMPT, seconds_waited=30.0, zone=ZONE, tier="spot", detail="stockout; token=s3cr3t", t=T0 - 30)
    ledger.append(L.ACTIVE, resource_id=f"{RUN}-a1", zone=ZONE, tier="spot", chips=8, generation="v4", t=T0)


def test_an_event_only_b_has_counts_and_an_event_both_have_counts_once(
    gcs: Any, bucket: str, two: tuple[Any, Any]
) -> None:
    a, b = two
    table = load_prices(a)
    per_hour = 8 * table.price("v4", "spot")
    layout = RunLayout.of(f"gs://{bucket}/runs", RUN)
    owner = L.Ledger(a, RUN)
    _active(owner)
    costs.Publisher(gcs, layout, owner).publish()
    # B tore the slice down: its DELETE_REQUESTED and GONE are in B's ledger only
    L.Ledger(b, RUN).append(L.DELETE_REQUESTED, resource_id=f"{RUN}-a1", zone=ZONE, t=T0 + 1800)
    L.Ledger(b, RUN).append(L.GONE, resource_id=f"{RUN}-a1", zone=ZONE, t=T0 + 3600)

    later = T0 + 7200
    seen = costs.known(b, RUN, table, gcs, layout, now=later)
    assert seen.published and seen.cost.open_slices == 0
    assert seen.cost.usd_total == pytest.approx(per_hour * 1.0, abs=1e-9)  # ACTIVE -> B's GONE: one hour
    assert seen.cost.chip_hours_by_phase == pytest.approx({"running": 4.0, "preempted": 0.0, "deleting": 4.0})
    # without B's GONE the slice bills on to `later`: two hours
    assert costs.known(a, RUN, table, gcs, layout, now=later).cost.usd_total == pytest.approx(per_hour * 2.0)

    # The same events in both (B holds a copy of A's, as A itself does): each counted once, the queue time too.
    _active(L.Ledger(b, RUN))
    twice = costs.known(b, RUN, table, gcs, layout, now=later)
    assert twice.cost.usd_total == pytest.approx(per_hour * 1.0, abs=1e-9) and twice.cost.queue_seconds == 30.0
    assert not twice.published  # nothing in the copy that B lacks
    assert len(costs.merge(L.Ledger(b, RUN).events(), costs.read(gcs, layout)["events"])) == 4


def test_the_copy_is_written_only_when_the_ledger_changed_holds_only_billing_fields_and_is_inherited(
    gcs: Any, bucket: str, two: tuple[Any, Any]
) -> None:
    a, b = two
    layout = RunLayout.of(f"gs://{bucket}/runs", RUN)
    owner = L.Ledger(a, RUN)
    publisher = costs.Publisher(gcs, layout, owner)
    assert publisher.publish() is not None and costs.read(gcs, layout) is None  # nothing billed: nothing written
    owner.claim()  # host and pid: not for the copy
    owner.append("choice", plan={"why": "cheapest", "key": "AKIA-not-for-the-copy"})
    _active(owner)

    def generation() -> int:
        blob = gcs.bucket(bucket).get_blob(layout.ledger.prefix)
        return 0 if blob is None else int(blob.generation)

    publisher.publish()
    first = generation()
    publisher.publish()
    publisher.publish()
    assert generation() == first  # unchanged ledger: no write
    raw = gcs.bucket(bucket).blob(layout.ledger.prefix).download_as_bytes()
    doc = json.loads(raw)
    assert set(doc) == {"version", "run_id", "as_of", "events"}
    assert [e["kind"] for e in doc["events"]] == [L.ATTEMPT, L.ACTIVE]
    assert all(set(e) <= set(costs.FIELDS) for e in doc["events"])
    for secret in (b"s3cr3t", b"AKIA", b"host", b"pid"):
        assert secret not in raw
    owner.append(L.PREEMPTED, resource_id=f"{RUN}-a1", zone=ZONE, t=T0 + 60)
    publisher.publish()
    assert generation() != first

    # A successor on machine B (the lease taken over) keeps A's events in the copy, adding its own.
    L.Ledger(b, RUN).append(L.GONE, resource_id=f"{RUN}-a1", zone=ZONE, t=T0 + 120)
    costs.Publisher(gcs, layout, L.Ledger(b, RUN)).publish()
    kinds = [e["kind"] for e in costs.read(gcs, layout)["events"]]
    assert kinds == [L.ATTEMPT, L.ACTIVE, L.PREEMPTED, L.GONE]


@pytest.mark.usefixtures("nothing_left")
def test_a_run_supervised_with_state_dir_a_shows_the_same_cost_from_state_dir_b(
    stack: Any, gcs: Any, ckpt_bucket: str, train_settings: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str]
) -> None:  # fmt: skip
    a = train_settings.model_copy(update={"state_dir": tmp_path / "A"})
    b = train_settings.model_copy(update={"state_dir": tmp_path / "B"})
    run_id = "cost-ab"
    job = job_spec(ckpt_bucket, steps=40, hyperparameters={"step_delay_s": 0.1})
    run = Run(job, run_id, a, wheel=agent_wheel(a))
    # what B knows of the run: where its state is (a launch record through Prefect, or its flow run)
    record = LaunchRecord(run_id, "train-job", PREFECT, checkpoint_dir=f"gs://{ckpt_bucket}/runs", zones=[ZONE],
                          hosts=1, accelerator="v4-8")  # fmt: skip

    def both(now: float) -> tuple[Any, Any]:
        return run_status(a, record, gcs, now=now), run_status(b, record, gcs, now=now)

    # training, and B has the copy (the first state save after the slice came up)
    wait_for(lambda: (s := both(time.time()))[1].cost_known and s[0].state == "running" and (s[0].step or 0) > 0,
             timeout=120, what="the run training, its cost published")  # fmt: skip
    now = time.time()
    here, there = both(now)
    assert here.cost_usd > 0 and there.cost_usd == here.cost_usd  # at the same moment: to the hundredth of a cent
    assert there.open_slices == here.open_slices == 1
    assert here.cost_as_of is None  # A reads its own ledger: nothing to say about staleness
    assert there.cost_as_of is not None and 0 <= now - there.cost_as_of < 30, there.cost_as_of
    text = detail(there)
    assert f"cost so far ${there.cost_usd:,.4f} (1 slice(s) billing) (as of " in text and " s ago)" in text
    assert there.to_json()["cost_as_of"] == there.cost_as_of
    assert f"; cost ${there.cost_usd:,.4f} (as of " in summary(there)  # `logs --follow`'s and `cancel`'s phrase

    report = run.result()
    assert report.outcome == "done"
    after = time.time() + 3600  # an ended, torn-down run's figure no longer moves: exact, whenever asked
    here, there = both(after)
    assert there.state == "done" and there.open_slices == 0 and there.cost_as_of is None
    assert there.cost_usd == here.cost_usd == round(L.Ledger(a, run_id).summary(load_prices(a)).usd_total, 4)
    assert there.cost_usd == round(report.cost["usd_total"], 4)  # and the goodput report's
    assert summary(there).endswith(f"; cost ${there.cost_usd:,.4f}, goodput {there.goodput:.1%}")
    assert f"\n  cost ${there.cost_usd:,.4f}; goodput " in detail(there)  # ended, nothing billing: not "so far"

    # `tpu-ops cost --run` in B (which launched it through Prefect: a launch record, no ledger) says the same
    launches.save(b, record)
    for name, value in {**stack.env(), "TPU_OPS_STATE_DIR": str(b.state_dir)}.items():
        monkeypatch.setenv(name, value)
    assert main(["cost", "--run", run_id, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["usd_total"] == there.cost_usd and doc["open_slices"] == 0 and doc["published_as_of"] > 0
    assert main(["cost", "--run", run_id]) == 0
    assert "; from the copy of its ledger its supervisor published " in capsys.readouterr().out


@pytest.mark.usefixtures("nothing_left")
def test_cancel_from_b_of_a_run_that_ended_with_its_slice_up_adds_its_gone_to_the_copy(
    stack: Any, gcs: Any, bucket: str, train_settings: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str]
) -> None:  # fmt: skip
    """The supervisor on A failed without releasing its slice (published open); `cancel` from B tears it down:
    B's GONE goes into the copy too, so a third shell sees the run's cost stop where B's teardown stopped it."""
    from tpu_ops.provision import provision
    from tpu_ops.provision.records import Slice
    from tpu_ops.train.incarnations import record_allocation
    from tpu_ops.train.runstate import IncarnationState, RunState, StateStore

    a, b, c = (train_settings.model_copy(update={"state_dir": tmp_path / d}) for d in "ABC")
    run_id = "cost-left"
    record = LaunchRecord(run_id, "train-job", PREFECT, checkpoint_dir=f"gs://{bucket}/runs", zones=[ZONE], hosts=1)
    got = provision(job_spec(bucket).provision, run_id, a)
    layout = record.layout
    assert layout is not None
    costs.Publisher(gcs, layout, L.Ledger(a, run_id)).publish()
    state = RunState(run_id, time.time() - 60, 30, outcome="failed", error="the supervisor's host went away")
    inc = IncarnationState(0, "0-left", time.time() - 60, end="failed", ended_at=time.time())
    record_allocation(inc, [Slice(run_id, got.queued_resource, got.node, ZONE, "spot", "v4-8", 4, 1, ())])
    state.incarnations = [inc]
    StateStore(gcs, layout.run_state).save(state)
    assert run_status(c, record, gcs).open_slices == 1  # billing, as far as anyone can tell

    launches.save(b, record)
    for name, value in {**stack.env(), "TPU_OPS_STATE_DIR": str(b.state_dir)}.items():
        monkeypatch.setenv(name, value)
    assert main(["cancel", run_id, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["already_ended"] and any(got.queued_resource in t for t in out["torn_down"]), out
    gone_at = [e["t"] for e in L.Ledger(b, run_id).events() if e["kind"] == L.GONE]
    assert gone_at and not [e for e in L.Ledger(a, run_id).events() if e["kind"] == L.GONE]
    third = run_status(c, record, gcs, now=time.time() + 3600)
    expected = L.summarise(run_id, L.Ledger(a, run_id).events() + L.Ledger(b, run_id).events(), load_prices(c))
    assert third.open_slices == 0 and third.cost_usd == round(expected.usd_total, 4) > 0
