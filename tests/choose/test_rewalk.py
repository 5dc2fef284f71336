"""The supervisor's side of a move (provision/rewalk.py, train/moves.py): the overlap each candidate is judged
with is its own believed obtain + recovery time, the fleet view keeps a full reservation from being a target,
a checkpoint's ranking reads no ledger, and a move the budget cannot pay is refused."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from three_rungs import OD, RES, SEEN, SPOT, A, B

from tpu_ops.cloud.clients import Clients
from tpu_ops.provision import ledger as L
from tpu_ops.provision.choose import RunModel, rank
from tpu_ops.provision.moving import worth_moving
from tpu_ops.provision.naming import resource_id
from tpu_ops.provision.prices import shipped
from tpu_ops.provision.rewalk import decide, move_s, over_budget, overlap_s
from tpu_ops.provision.viewing import View, with_view
from tpu_ops.specs.slice import ProvisionSpec
from tpu_ops.uris import parse_gs

RUN = RunModel(steps=3600, seconds_per_step=1.0, checkpoint_every=600)


def test_the_overlap_is_the_target_s_believed_obtain_and_recovery() -> None:
    choice = rank([RES, SPOT, OD], RUN, SEEN)
    res = next(r.expectation for r in choice.ranked if r.expectation.rung == RES)
    assert move_s(choice, RES.order) == pytest.approx(res.belief.obtain_s + res.belief.recovery_s, rel=1e-12)
    m = decide(choice, SPOT.order)
    assert m is not None and m == worth_moving(choice, SPOT.order, move_s(choice, RES.order))
    assert m.move_usd == pytest.approx(move_s(choice, RES.order) / 3600 * SPOT.usd_per_hour, rel=1e-12)


def test_no_move_from_the_best_rung_nor_to_a_reservation_the_view_says_is_full() -> None:
    choice = rank([RES, SPOT, OD], RUN, SEEN)
    assert decide(choice, RES.order) is None
    full = with_view(choice, View({"team-res": 0}))
    assert decide(full, SPOT.order) is None  # the reservation is ranked after spot: nothing ahead is worth it
    assert decide(with_view(choice, View({"team-res": 1})), SPOT.order) is not None
    assert decide(rank([RES, SPOT, OD], RUN, {}), OD.order) is None  # no history: the written order never moves


def test_each_candidate_is_weighed_with_its_own_believed_overlap_in_one_call() -> None:
    """From on-demand: the reservation, with its own overlap (34.29 s to obtain + 300 s to recover, at
    on-demand's $16.80/h: $1.56), the overlap the move keeps for the budget's check."""
    choice = rank([RES, SPOT, OD], RUN, SEEN)
    m = decide(choice, OD.order)
    assert m is not None and m == worth_moving(choice, OD.order, overlap_s)
    assert m.to == RES.order and m.overlap_s == pytest.approx(334.2857142857143, rel=1e-12)
    assert m.move_usd == pytest.approx(1.56, rel=1e-12)


# -- the budget ------------------------------------------------------------------------------------

SPEC = ProvisionSpec.model_validate({
    "slice": {"accelerator_type": "v5p-8", "backend": "compute", "region": "us-east5", "zones": [A, B]},
    "ladder": [f"reservation:team-res@{A}", "spot", "on-demand"], "budget_usd": 25, "hours": 1,
})  # fmt: skip


def test_a_move_over_the_budget_is_refused_with_the_figures() -> None:
    """v5p-8 (4 chips) on spot ($2.10/chip-hour listed) moving to the reservation ($4.20 listed): $5 spent,
    334.29 s of overlap at spot's $8.40/h ($0.78), the hour of work left at the reservation's $16.80: $22.58."""
    choice = rank([RES, SPOT, OD], RUN, SEEN)
    m = decide(choice, SPOT.order)
    assert m is not None and m.to == RES.order
    table = shipped()
    assert over_budget(SPEC, table, 5.0, RUN, choice, SPOT.order, m) == ""
    at = SPEC.model_copy(update={"budget_usd": 22.58})
    assert over_budget(at, table, 5.0, RUN, choice, SPOT.order, m) == ""  # exactly the budget fits
    why = over_budget(SPEC.model_copy(update={"budget_usd": 22.57}), table, 5.0, RUN, choice, SPOT.order, m)
    assert why == (
        "over budget: $5.00 spent + $0.78 for 334 s of both slices + $16.80 for the remaining 1.00 h on "
        "reservation team-res in us-east5-a = $22.58 exceeds budget_usd $22.57"
    )
    # Half the work left ($8.40): $5 + $0.78 + $8.40 = $14.18 fits a budget of $14.18, not one a cent less.
    half = replace(RUN, steps=1800)
    assert over_budget(SPEC.model_copy(update={"budget_usd": 14.18}), table, 5.0, half, choice, SPOT.order, m) == ""
    assert over_budget(SPEC.model_copy(update={"budget_usd": 14.17}), table, 5.0, half, choice, SPOT.order, m)


# -- the supervisor's side: a real Supervisor over fake-gcs-server (no slice: a TPU API endpoint never called) --

TPU_ZONE = "us-central2-b"


def _supervisor(env: dict[str, str], auth: Any, tmp: Path, held: str, budget: float) -> tuple[Any, Any, list[Any]]:
    """Run ``r`` (v4-8, ladder spot then on-demand, 100 steps in 1 h) training on ``held`` with step 20
    committed; the capacity history: spot and on-demand 10 h each, never preempted (spot ranks first)."""
    from tpu_ops.run import Run
    from tpu_ops.settings import Settings
    from tpu_ops.specs import TrainJobSpec
    from tpu_ops.train.runstate import IncarnationState
    from tpu_ops.train.supervisor import Supervisor

    settings = Settings(dry_run=True, gcs_endpoint=env["TPU_OPS_GCS_ENDPOINT"], state_dir=str(tmp),
                        tpu_endpoint="http://127.0.0.1:9", **auth.settings_overrides())  # fmt: skip
    gcs = Clients(settings).gcs()
    bucket = f"rewalk-{tmp.name.lower().replace('_', '-')}"[:60]
    b = gcs.create_bucket(bucket)
    for run, tier in (("old-spot", "spot"), ("old-od", "on-demand")):
        st = {"incarnations": [{"zone": TPU_ZONE, "tier": tier, "requested_at": 0.0, "ready_at": 60.0,
                                "ended_at": 36060.0}]}  # fmt: skip
        b.blob(f"runs/{run}/_tpu_ops/state.json").upload_from_string(json.dumps(st))
        ident = {"accelerator_type": "v4-8", "backend": "tpu-api", "chips": 4}
        b.blob(f"runs/{run}/_tpu_ops/capacity.json").upload_from_string(json.dumps(ident))
    job = TrainJobSpec.model_validate({
        "provision": {"slice": {"accelerator_type": "v4-8", "region": "us-central2", "zones": [TPU_ZONE]},
                      "ladder": ["spot", "on-demand"], "choose": {}, "budget_usd": budget, "hours": 1},
        "train": {"checkpoint_dir": f"gs://{bucket}/runs", "steps": 100, "checkpoint_every": 10, "command": ["true"]},
    })  # fmt: skip
    events: list[Any] = []
    sup = Supervisor(
        job, Run.of_job("r", settings, job), wheel=Path("unused.whl"), notify=lambda n, p: events.append((n, p))
    )
    number = {"spot": 1, "on-demand": 2}[held]
    inc = IncarnationState(0, "0-x", time.time() - 3000, resource_id("r", number), TPU_ZONE, held, last_step=20)
    sup.state.incarnations.append(inc)
    _commit(sup, 20)
    return sup, inc, events


def _commit(sup: Any, step: int) -> None:
    run = parse_gs(sup.layout.steps_uri)
    sup.gcs.bucket(run.bucket).blob(f"{run.prefix}/{step}/commit_success.txt").upload_from_string("ok")


def test_a_checkpoint_s_ranking_reads_no_ledger(gcs_env: dict[str, str], google_auth: Any, tmp_path: Path) -> None:
    """The ledger is a directory here, so reading it raises; the ranking at step 20 (no move: spot, held, ranks
    first) counts the deadline from the run state's start and never opens it."""
    sup, inc, _ = _supervisor(gcs_env, google_auth, tmp_path, "spot", 1000)
    sup.ledger.path.mkdir(parents=True)
    sup.mover.consider(inc)
    assert sup.mover.seen == 20 and sup.state.moves == []


def test_a_move_the_budget_refuses_is_recorded_once_and_asks_for_nothing(
    gcs_env: dict[str, str], google_auth: Any, tmp_path: Path
) -> None:
    """On on-demand (v4-8: $12.88/h listed) for 3000 s ($10.73 spent), spot ranked ahead: $13 (what the start
    check asks: an hour on-demand, $12.88) cannot also pay the 0.8 h left on spot ($4.64)."""
    sup, inc, events = _supervisor(gcs_env, google_auth, tmp_path, "on-demand", 13)
    sup.ledger.append(L.ACTIVE, resource_id=inc.queued_resource, zone=TPU_ZONE, tier="on-demand", chips=4,
                      generation="v4", t=inc.requested_at)  # fmt: skip
    sup.lease.acquire()
    try:
        sup.mover.consider(inc)
        (mv,) = sup.state.moves
        assert (mv.phase, mv.to_tier, mv.from_tier, mv.checkpoint) == ("refused", "spot", "on-demand", 20)
        assert mv.detail.startswith("over budget: $10.7") and mv.detail.endswith("exceeds budget_usd $13.00")
        assert "+ $4.64 for the remaining 0.80 h on spot in us-central2-b" in mv.detail
        assert mv.ended_at == mv.asked_at and mv.granted_at is None
        assert sup.store.load().moves == [mv]  # in the run state, as a refusal for capacity is
        assert [n for n, _ in events] == ["slice.moved"] and events[0][1]["detail"] == mv.detail
        # Nothing was asked: no attempt in the ledger, no stockout counted against spot.
        assert [e["kind"] for e in sup.ledger.events()] == [L.ACTIVE] and sup.state.stockouts == []
        # The next checkpoint ranks again; the same refusal is not recorded twice.
        inc.last_step = 30
        _commit(sup, 30)
        sup.mover.consider(inc)
        assert sup.mover.seen == 30 and len(sup.state.moves) == 1 and len(events) == 1
    finally:
        sup.lease.release()


def test_the_checkpoint_s_ranking_is_the_walk_s_from_the_same_start(
    gcs_env: dict[str, str], google_auth: Any, tmp_path: Path
) -> None:
    """The figures are those a walk (``ranking.apply``, which reads the start from the ledger's first event)
    makes with the same start: the same choice, the deadline counted from it (max_duration 24 h by default)."""
    from tpu_ops.provision import ranking
    from tpu_ops.provision.rewalk import rank_now
    from tpu_ops.provision.steps import plan

    sup, _, _ = _supervisor(gcs_env, google_auth, tmp_path, "on-demand", 1000)
    spec, clients, table, now = sup.job.provision, sup.slices.clients, shipped(), sup.state.started_at + 1800.0
    walk = L.Ledger(sup.settings, "walk")
    walk.append(L.OWNER, t=sup.state.started_at)
    _, walked = ranking.apply(spec, plan(spec), clients, "walk", walk, table, lambda: 20, now=now)
    choice, run, view = rank_now(spec, clients, table, 20, sup.state.started_at, now=now)
    assert walked is not None and choice == walked and choice.method == "cost" and view is None
    assert run.steps == 80 and run.deadline_s == 24 * 3600.0 - 1800.0
    assert [r.expectation.rung.tier for r in choice.ranked] == ["spot", "on-demand"]
