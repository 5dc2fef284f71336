"""A voluntary move at a checkpoint boundary (provision/moving.py): when a rung ranked now beats staying."""

from __future__ import annotations

from dataclasses import replace

import pytest
from three_rungs import OD, RES, SEEN, SPOT, A

from tpu_ops.provision import history as H
from tpu_ops.provision.choose import History, RunModel, held_time, rank
from tpu_ops.provision.moving import MARGIN, worth_moving

RUN = RunModel(steps=3600, seconds_per_step=1.0, checkpoint_every=600)
# Spot's belief from SEEN: 0.5 preemptions/h, 300 s to recover; an hour of work checkpointed every 10 min.
SPOT_HELD_S = held_time(3600.0, 600.0, 0.5 / 3600.0, 300.0)[0]


def test_a_run_on_spot_moves_to_the_free_reservation_ranked_ahead_of_it() -> None:
    choice = rank([RES, SPOT, OD], RUN, SEEN)
    move = worth_moving(choice, SPOT.order, move_s=120.0)
    assert move is not None and move.to == RES.order
    # Staying: spot's expected held time for an hour of work (3913.99 s) at $8.40/h; moving: the
    # reservation is prepaid ($0) plus two minutes at the held spot's price.
    assert pytest.approx(3913.9868682792694, rel=1e-12) == SPOT_HELD_S
    assert move.stay_usd == pytest.approx(SPOT_HELD_S / 3600.0 * 8.4, rel=1e-12) == pytest.approx(9.1326, abs=1e-4)
    assert move.move_usd == pytest.approx(120.0 / 3600.0 * 8.4, rel=1e-12)
    assert move.why == (
        "reservation team-res in us-east5-a is expected to cost $0.28 for the remaining work against $9.13 "
        "staying on spot in us-east5-b"
    )


def test_staying_carries_no_scarcity_charge_the_target_does() -> None:
    """Spot refused half its asks: its scarcity charge ($3.81 here) is the price of asking for it, which a
    run holding it does not pay; an on-demand run asking for it does."""
    seen = {**SEEN, SPOT.key: History(hours=10.0, preemptions=5, obtained=5, stockouts=5)}
    choice = rank([RES, SPOT, OD], RUN, seen)
    spot = next(r.expectation for r in choice.ranked if r.expectation.rung == SPOT)
    assert spot.scarcity_usd == pytest.approx(3.8052650108270676, rel=1e-9)
    move = worth_moving(choice, SPOT.order, move_s=120.0)
    assert move is not None and move.stay_usd == spot.usd
    without_res = rank([SPOT, OD], RUN, seen)
    od = next(r.expectation for r in without_res.ranked if r.expectation.rung == OD)
    move = worth_moving(without_res, OD.order, move_s=120.0)
    assert move is not None and move.to == SPOT.order
    assert move.stay_usd == od.usd
    assert move.move_usd == pytest.approx(spot.usd + spot.scarcity_usd + 120.0 / 3600.0 * 16.8, rel=1e-12)


def test_the_margin_is_a_share_of_staying() -> None:
    choice = rank([SPOT, OD], RUN, SEEN)
    move = worth_moving(choice, OD.order, move_s=120.0)
    assert move is not None and move.to == SPOT.order
    saved = 1.0 - move.move_usd / move.stay_usd  # 42.4%
    assert saved == pytest.approx(0.4236066087827651, rel=1e-9) and MARGIN == 0.1
    assert worth_moving(choice, OD.order, move_s=120.0, margin=saved - 1e-9) is not None
    assert worth_moving(choice, OD.order, move_s=120.0, margin=saved + 1e-9) is None


def test_no_move_from_the_best_rung_or_when_the_saving_is_inside_the_margin() -> None:
    choice = rank([RES, SPOT, OD], RUN, SEEN)
    assert worth_moving(choice, RES.order, move_s=120.0) is None
    # A handover overlap that eats the saving: an hour of work at $9.13 against an hour of spot, $8.40.
    assert worth_moving(choice, SPOT.order, move_s=3600.0) is None


def test_no_move_between_rungs_of_one_price() -> None:
    """A steadier spot zone ranked ahead of the held one saves here by the estimates alone: no move."""
    steady = replace(SPOT, zone=A, order=4)
    seen = {
        **SEEN,
        SPOT.key: History(hours=10.0, preemptions=20, obtained=5),
        steady.key: History(hours=10.0, obtained=5),
    }
    choice = rank([steady, SPOT, OD], RUN, seen)
    assert [r.expectation.rung for r in choice.ranked] == [steady, SPOT, OD]
    ahead, held = (r.expectation for r in choice.ranked[:2])
    assert ahead.usd + 120.0 / 3600.0 * 8.4 < held.usd * (1.0 - MARGIN)  # cheaper by the estimates
    assert worth_moving(choice, SPOT.order, move_s=120.0) is None
    # From on-demand, the same steady spot is a move.
    move = worth_moving(choice, OD.order, move_s=120.0)
    assert move is not None and move.to == steady.order


def test_no_move_that_raises_the_deadline_risk() -> None:
    """Due in 5000 s: spot makes it (P(miss) 0.24% ≤ 10%, ranked first) but on-demand, held, misses
    less (0.0016%): staying. Without the deadline both are 0: the move is worth it."""
    due = replace(RUN, deadline_s=5000.0)
    choice = rank([SPOT, OD], due, SEEN)
    spot, od = (r for r in choice.ranked)
    assert spot.expectation.rung == SPOT and spot.eligible and spot.position < od.position
    assert spot.expectation.miss_probability == pytest.approx(0.0023917297434685385, rel=1e-9)
    assert od.expectation.miss_probability == pytest.approx(1.6295418948986118e-05, rel=1e-9)
    assert worth_moving(choice, OD.order, move_s=120.0) is None
    move = worth_moving(rank([SPOT, OD], RUN, SEEN), OD.order, move_s=120.0)
    assert move is not None and move.to == SPOT.order


def test_an_unknown_held_rung_or_the_written_order_never_moves() -> None:
    choice = rank([RES, SPOT, OD], RUN, {})  # no history: the written order, no cost to compare
    assert choice.method == "written-order"
    assert worth_moving(choice, OD.order, move_s=0.0) is None
    assert worth_moving(rank([RES, SPOT, OD], RUN, SEEN), 99, move_s=0.0) is None


def test_a_moved_slice_folds_as_held_hours_not_a_preemption() -> None:
    """The old slice's record ends "moved": its hours count for its rung, no preemption, no recovery."""
    inc = {"zone": "us-east5-b", "tier": "spot", "requested_at": 1000.0, "ready_at": 1180.0, "ended_at": 4780.0,
           "end": "moved"}  # fmt: skip
    folded = H.fold_run({"incarnations": [inc], "preemptions": []}, {"accelerator_type": "v5p-8", "backend": "compute"})
    assert folded == {("v5p-8", "us-east5-b", "spot", "compute"): History(hours=1.0, obtained=1, obtain_s_total=180.0)}


def test_a_rung_skipped_ahead_does_not_end_the_search() -> None:
    """Ranked ahead of the held flaky spot: the steady spot (one price: skipped), then the reservation,
    full often enough that its scarcity charge ($8.96) ranks it second: still a move, $9.24 < 90% of $10.95."""
    steady = replace(SPOT, zone=A, order=4)
    seen = {
        RES.key: History(hours=10.0, obtained=5, stockouts=8),
        SPOT.key: History(hours=10.0, preemptions=20, obtained=5),
        steady.key: History(hours=10.0, obtained=5),
        OD.key: History(hours=10.0, obtained=5),
    }
    choice = rank([RES, steady, SPOT, OD], RUN, seen)
    assert [r.expectation.rung for r in choice.ranked] == [steady, RES, SPOT, OD]
    move = worth_moving(choice, SPOT.order, move_s=120.0)
    assert move is not None and move.to == RES.order
    assert move.move_usd == pytest.approx(9.244267767397357, rel=1e-9)
    assert move.stay_usd == pytest.approx(10.946206123388231, rel=1e-9)


def test_each_target_weighed_with_its_own_overlap_in_one_call() -> None:
    """From on-demand ($16.82 staying): the reservation is free but its handover holds both slices 4000 s
    here ($18.67 at on-demand's price: no saving), spot's 120 s ($9.13 + $0.56). One figure for both
    names the reservation (120 s) or nothing (4000 s); the overlap per target names spot."""
    choice = rank([RES, SPOT, OD], RUN, SEEN)
    overlaps = {RES.order: 4000.0, SPOT.order: 120.0}
    move = worth_moving(choice, OD.order, lambda e: overlaps[e.rung.order])
    assert move is not None and move.to == SPOT.order and move.overlap_s == 120.0
    assert move.stay_usd == pytest.approx(16.816008256992557, rel=1e-12)
    assert move.move_usd == pytest.approx(9.132636025984963 + 120.0 / 3600.0 * 16.8, rel=1e-12)
    assert move.move_usd == pytest.approx(9.692636025984964, rel=1e-12)
    one = worth_moving(choice, OD.order, 120.0)
    assert one is not None and one.to == RES.order and one.move_usd == pytest.approx(0.56, rel=1e-12)
    assert worth_moving(choice, OD.order, 4000.0) is None
    # A callable giving the single figure decides as the figure does.
    assert worth_moving(choice, OD.order, lambda e: 120.0) == one
