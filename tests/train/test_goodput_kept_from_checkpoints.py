"""Steps whose records went with a VM deleted before its last heartbeat are still kept steps: the committed
checkpoint the next incarnation resumed from proves them. Their seconds are not invented (they stay in "other")."""

from __future__ import annotations

from tpu_ops.train import goodput as G
from tpu_ops.train.runstate import IncarnationState, RunState


def _state(records_up_to: int) -> RunState:
    state = RunState("lost-records", 0.0, 15)
    first = IncarnationState(0, "0-a", 0.0, resume_step=None)
    first.ready_at, first.ended_at, first.end, first.kept_until = 0.0, 8.0, "preempted", 7
    first.timeline = [["step", s, float(s - 1), float(s)] for s in range(1, records_up_to + 1)]
    second = IncarnationState(1, "1-b", 8.0, resume_step=7)
    second.ready_at, second.ended_at, second.end, second.kept_until = 8.0, 16.0, "done", 15
    second.timeline = [["step", s, float(s), float(s + 1)] for s in range(8, 16)]
    state.incarnations = [first, second]
    state.final_step, state.finished_at, state.outcome = 15, 16.0, "done"
    return state


def test_kept_steps_count_what_the_checkpoints_prove_and_time_only_what_was_recorded() -> None:
    whole = G.GoodputReport.derive(_state(records_up_to=7), now=99.0)
    short = G.GoodputReport.derive(_state(records_up_to=2), now=99.0)  # steps 3-7's records lost with the VM
    assert whole.steps_kept == short.steps_kept == 15
    assert whole.categories[G.PRODUCTIVE] == 15.0 and short.categories[G.PRODUCTIVE] == 10.0
    assert short.categories[G.OTHER] - whole.categories[G.OTHER] == 5.0  # not called productive: not seen


def test_a_live_incarnation_keeps_nothing_it_has_not_committed() -> None:
    state = _state(records_up_to=7)
    state.incarnations[1].end, state.incarnations[1].kept_until, state.finished_at = "", None, None
    assert G.GoodputReport.derive(state, now=16.0).steps_kept == 7


def test_exactly_the_steps_between_the_resume_step_and_the_checkpoint() -> None:
    state = _state(records_up_to=2)
    state.incarnations[1].timeline = state.incarnations[1].timeline[1:]  # step 8's record lost too
    assert G.GoodputReport.derive(state, now=99.0).steps_kept == 15  # 8 counted: resumed from 7, kept to 15
    state.incarnations[1].end, state.incarnations[1].kept_until, state.finished_at = "", None, None
    assert G.GoodputReport.derive(state, now=16.0).steps_kept == 7  # not 8: the live one committed nothing yet
