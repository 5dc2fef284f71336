"""A voluntary move at a checkpoint boundary (provision/moving.py): when a rung ranked now beats staying."""

from __future__ import annotations

from three_rungs import OD, RES, SEEN, SPOT

from tpu_ops.provision.choose import RunModel, rank
from tpu_ops.provision.moving import worth_moving

RUN = RunModel(steps=3600, seconds_per_step=1.0, checkpoint_every=600)


def test_a_run_on_spot_moves_to_the_free_reservation_ranked_ahead_of_it() -> None:
    choice = rank([RES, SPOT, OD], RUN, SEEN)
    move = worth_moving(choice, SPOT.order, move_s=120.0)
    assert move is not None and move.to == RES.order
    # Staying: spot's expected held time for an hour of work at $8.40/h; moving: the reservation is
    # prepaid ($0) plus two minutes of spot held during the handover.
    spot = next(r.expectation for r in choice.ranked if r.expectation.rung == SPOT)
    assert move.stay_usd == spot.usd + spot.scarcity_usd
    assert move.move_usd == 120.0 / 3600.0 * 8.4


def test_no_move_from_the_best_rung_or_when_the_saving_is_inside_the_margin() -> None:
    choice = rank([RES, SPOT, OD], RUN, SEEN)
    assert worth_moving(choice, RES.order, move_s=120.0) is None
    # A handover overlap that eats the saving: an hour of spot at $8.40 against ~$8.40 of overlap.
    assert worth_moving(choice, SPOT.order, move_s=3600.0) is None


def test_an_unknown_held_rung_or_the_written_order_never_moves() -> None:
    choice = rank([RES, SPOT, OD], RUN, {})  # no history: the written order, no cost to compare
    assert choice.method == "written-order"
    assert worth_moving(choice, OD.order, move_s=0.0) is None
    assert worth_moving(rank([RES, SPOT, OD], RUN, SEEN), 99, move_s=0.0) is None
