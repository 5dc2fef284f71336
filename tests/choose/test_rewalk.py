"""The supervisor's side of a move (provision/rewalk.py): the overlap each candidate is judged with is its
own believed obtain + recovery time, and the fleet view keeps a full reservation from being a target."""

from __future__ import annotations

import pytest
from three_rungs import OD, RES, SEEN, SPOT

from tpu_ops.provision.choose import RunModel, rank
from tpu_ops.provision.moving import worth_moving
from tpu_ops.provision.ranking import View, with_view
from tpu_ops.provision.rewalk import decide, move_s

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
