"""What a move leaves in the records (no stack): the goodput report accounts the overlap and keeps the
steps, the capacity history counts no preemption, ``tpu-ops status`` shows it, the spec says how to
turn it off. The end-to-end moves are in test_moves.py."""

from __future__ import annotations

from typing import Any

import pytest

from tpu_ops.errors import SpecError
from tpu_ops.provision.history import fold_run
from tpu_ops.specs.loader import parse_spec
from tpu_ops.specs.slice import ProvisionSpec
from tpu_ops.train.goodput import GoodputReport
from tpu_ops.train.runstate import IncarnationState, MoveState, RunState

A = "us-east5-a"


def _moved() -> RunState:
    """Spot from t=10 (asked at 0) to its deletion at 50; the reservation asked at 30, granted at 40, done at 70."""
    spot = IncarnationState(0, "0-a", 0.0, "r-a2", A, "spot", ready_at=10.0, ended_at=50.0, end="moved",
                            kept_until=20, last_step=20, timeline=[["step", s, 10.0 + s, 11.0 + s]
                                                                   for s in range(1, 16)])  # fmt: skip
    res = IncarnationState(1, "1-b", 30.0, "r-a1", A, "reservation", ready_at=40.0, resume_step=20, ended_at=70.0,
                           end="done", kept_until=40, last_step=40, timeline=[["step", s, 30.0 + s, 31.0 + s]
                                                                              for s in range(21, 41)])  # fmt: skip
    mv = MoveState(1, 0, "1-b", 20, "r-a2", "spot", A, "r-a1", "reservation", A, "cheaper", 5.0, 1.0, 30.0,
                   phase="moved", granted_at=40.0, stopped_at=45.0, ended_at=50.0, resume_step=20)  # fmt: skip
    return RunState("r", 0.0, 40, outcome="done", finished_at=70.0, final_step=40, incarnations=[spot, res],
                    moves=[mv])  # fmt: skip


def test_the_report_keeps_every_step_and_shows_the_overlap_not_a_preemption() -> None:
    state = _moved()  # the old slice's records of steps 16-20 never reached a heartbeat: its checkpoint keeps them
    doc = GoodputReport.derive(state, 70.0).to_json()
    assert doc["steps_kept"] == 40 and doc["recoveries"] == 0 and doc["preemptions"] == []
    assert doc["moves"][0]["overlap_s"] == 10.0 and doc["moves"][0]["phase"] == "moved"
    # Held: spot 40 s + reservation 30 s; asked: spot's 10 s only (the move asked while spot trained).
    assert doc["scheduling_goodput"] == pytest.approx(70 / 80, abs=1e-4)
    assert "1 move(s) (10.0s with both slices held)" in GoodputReport.derive(state, 70.0).summary()
    assert RunState.from_json(state.to_json()) == state  # the run state keeps the move


def test_a_move_is_no_preemption_in_the_capacity_history() -> None:
    folded = fold_run(_moved().to_json(), {"accelerator_type": "v5p-8", "backend": "compute"})
    spot, res = folded[("v5p-8", A, "spot", "compute")], folded[("v5p-8", A, "reservation", "compute")]
    assert spot.preemptions == 0 and res.preemptions == 0
    assert spot.hours == pytest.approx(40 / 3600) and res.obtain_s_total == pytest.approx(10.0)


def test_status_shows_the_move_and_why() -> None:
    from flows.commands.status import detail
    from tpu_ops.train.status import RunStatus

    s = RunStatus("r", "train", "local", "running", 0.0, step=30, steps=40)
    s.moves = [{"number": 1, "from": f"spot in {A}", "to": f"reservation in {A}", "phase": "moved",
                "checkpoint": 20, "why": "cheaper", "overlap_s": 10.0}]  # fmt: skip
    assert f"  move 1 at step 20: spot in {A} -> reservation in {A}, moved (10 s both held): cheaper" in detail(s)


def test_move_must_be_a_boolean_and_is_on_by_default() -> None:
    base: dict[str, Any] = {"slice": {"accelerator_type": "v5p-8", "region": "us-east5", "zones": [A]},
                            "ladder": "auto", "budget_usd": 10, "hours": 1}  # fmt: skip
    spec = parse_spec(ProvisionSpec, base)
    assert spec.choose is not None and spec.choose.move is True
    with pytest.raises(SpecError) as err:
        parse_spec(ProvisionSpec, {**base, "choose": {"move": "sometimes"}})
    assert "  choose.move: Input should be a valid boolean" in str(err.value).splitlines()[1]
