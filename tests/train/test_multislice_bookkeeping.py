"""Issue 29: the bookkeeping of a multislice preemption, fast (no slice): the step the preempted incarnation
kept follows the step its successor's workers resumed from, the preemption names the lost slice's zone and
tier, and the kept slices' workers are waited for until their own grace is over."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from tpu_ops.layout import RunLayout
from tpu_ops.train import goodput as G
from tpu_ops.train.incarnations import absorb_heartbeats
from tpu_ops.train.layout import put_json
from tpu_ops.train.notices import await_notices, wait_for_exit_reports
from tpu_ops.train.recovery import lost_resource, open_preemption
from tpu_ops.train.runstate import IncarnationState, PreemptionState, RunState, SliceState


def _steps(first: int, last: int, t0: float) -> list[list[Any]]:
    return [["step", s, t0 + s - first, t0 + s - first + 1.0] for s in range(first, last + 1)]


def committed_after_the_close() -> tuple[RunState, list[dict[str, Any]]]:
    """2 slices, 30 steps. Incarnation 0: asked 0, ready 1, steps 1-15 of 1 s from 1, a save of step 15 at
    16-17 that the kept slice committed after the preemption was closed (``kept_until`` read then: 10), so
    the supervisor also read 10 as incarnation 1's resume step. Incarnation 1: asked 17, ready 20, its
    workers restored step 15 (20-21) and ran steps 16-30 from 21, a save at 36-37; done at 37.
    Worked out: productive 15 + 15 = 30, saves 2, restore 1, tpu_init 0-1, recovery 17-20 (3): 37 = wall."""
    inc0 = IncarnationState(0, "0-a", 0.0, "r-a1", "z", "spot", ready_at=1.0, ended_at=17.0, end="preempted",
                            kept_until=10, last_step=15,
                            timeline=[*_steps(1, 15, 1.0), ["save", 15, 16.0, 17.0]])  # fmt: skip
    inc1 = IncarnationState(1, "1-b", 17.0, "r-a1", "z", "spot", ready_at=20.0, resume_step=10, ended_at=37.0,
                            end="done", kept_until=30, last_step=30)  # fmt: skip
    p = PreemptionState(1, 0, "node PREEMPTED", "r-a1001", "z", "spot", 17.0, 16.5, 15, resume_step=10,
                        steps_lost=5)  # fmt: skip
    state = RunState("ms", 0.0, 30, "done", 37.0, 30, incarnations=[inc0, inc1], preemptions=[p])
    timeline = [["restore", 15, 20.0, 21.0], *_steps(16, 30, 21.0), ["save", 30, 36.0, 37.0]]
    beats = [  # slice 0's worker 0 carries the records; slice 1's worker 0 reports its own (ignored) resume
        {"worker": 0, "slice": 0, "incarnation": "1-b", "step": 30, "resume_step": 15, "time": 37.0,
         "state": "exited", "timeline": timeline},
        {"worker": 0, "slice": 1, "incarnation": "1-b", "step": 30, "resume_step": 99, "time": 37.0,
         "state": "exited"},
    ]  # fmt: skip
    return state, beats


def test_the_step_resumed_from_is_the_step_kept_exact_figures() -> None:
    state, beats = committed_after_the_close()
    absorb_heartbeats(state.incarnations[1], beats, state)
    inc0, inc1 = state.incarnations
    assert (inc0.kept_until, inc1.resume_step) == (15, 15)
    p = state.preemptions[0]
    assert (p.resume_step, p.steps_lost) == (15, 0)
    r = G.GoodputReport.derive(state, now=999.0)
    assert r.steps_kept == 30 == r.final_step
    assert r.categories == {G.PRODUCTIVE: 30.0, G.TPU_INITIALIZATION: 1.0, G.TRAINING_PREP: 0.0,
                            G.PROGRAM_STARTUP: 0.0, G.DATA_LOADING: 0.0, G.CHECKPOINT_SAVE: 2.0,
                            G.CHECKPOINT_RESTORE: 1.0, G.WASTED_PROGRESS: 0.0, G.INFRASTRUCTURE_RECOVERY: 3.0,
                            G.OTHER: 0.0}  # fmt: skip


def test_a_step_saved_on_the_notice_after_the_last_heartbeat_counts_as_reached() -> None:
    """Seen in a loaded dry run: the last heartbeat said 11, the workers agreed on 15 after the notice, caught
    up and saved it, and the next incarnation resumed from 15. The preemption read last step 11, resume 15:
    a step resumed from was reached, so the record says 15 and 0 lost, never a last step behind the resume."""
    state, beats = committed_after_the_close()
    p = state.preemptions[0]
    p.last_step, p.resume_step, p.steps_lost = 11, None, None
    absorb_heartbeats(state.incarnations[1], beats, state)  # p has no resume step yet: the walk sets it
    p.resumed_from(15)
    assert (p.last_step, p.resume_step, p.steps_lost) == (15, 15, 0)
    p.resumed_from(10)  # an earlier step: what was reached stays, and the gap is lost
    assert (p.last_step, p.resume_step, p.steps_lost) == (15, 10, 5)
    p.last_step = 12
    state.incarnations[1].resume_step = None
    absorb_heartbeats(state.incarnations[1], beats, state)  # the workers' own resume step (15) corrects it
    assert (p.last_step, p.resume_step, p.steps_lost) == (15, 15, 0)


def test_without_the_workers_resume_step_five_kept_steps_are_timed_as_wasted() -> None:
    """What the supervisor did before: its own early readings (10 and 10) call steps 11-15 (kept and resumed
    from) wasted. The count stays right (the checkpoints prove every step kept); their seconds do not."""
    state, beats = committed_after_the_close()
    for b in beats:
        b.pop("resume_step")
    absorb_heartbeats(state.incarnations[1], beats, state)
    r = G.GoodputReport.derive(state, now=999.0)
    assert r.steps_kept == 30 and r.categories[G.PRODUCTIVE] == 25.0 and r.categories[G.WASTED_PROGRESS] == 6.0


def test_an_incarnation_that_failed_keeps_its_own_kept_until() -> None:
    """Only a preempted incarnation's kept step follows its successor (a failed one's is its own)."""
    state, beats = committed_after_the_close()
    state.incarnations[0].end = "failed"
    absorb_heartbeats(state.incarnations[1], beats, state)
    assert state.incarnations[0].kept_until == 10 and state.incarnations[1].resume_step == 15


@pytest.mark.parametrize(("lost", "zone", "tier"), [(1, "z-b", "on-demand"), (0, "z-a", "spot"), (None, "z-a", "spot")])
def test_the_preemption_names_the_lost_slices_zone_and_tier(lost: int | None, zone: str, tier: str) -> None:
    inc = IncarnationState(0, "0-a", 0.0, "r-a1", "z-a", "spot", ready_at=1.0,
                           slices=[SliceState(0, "r-a1", "z-a", "spot", 1), SliceState(1, "r-a1001", "z-b",
                                                                                        "on-demand", 1)])  # fmt: skip
    state = RunState("ms", 0.0, 30, incarnations=[inc])
    p = open_preemption(state, inc, "node PREEMPTED", "r-x", unsupervised=False, lost=lost)
    assert (p.zone, p.tier, p.queued_resource) == (zone, tier, "r-x") and state.preemptions == [p]


def test_a_loss_found_unsupervised_without_a_slice_named_is_recorded_unknown_not_as_slice_0() -> None:
    """A supervisor taking over holds no slice yet: the lost one comes from the run state's allocation; when
    the evidence names none of several (reports from every slice), the slice is unknown, the zone all share kept."""
    inc = IncarnationState(0, "0-a", 0.0, "r-a1", "z-a", "spot", ready_at=1.0,
                           slices=[SliceState(0, "r-a1", "z-a", "spot", 1), SliceState(1, "r-a1001", "z-a",
                                                                                        "on-demand", 1)])  # fmt: skip
    assert lost_resource(inc, [], 1, unsupervised=True) == "r-a1001"
    assert lost_resource(inc, [], None, unsupervised=True) == ""
    assert lost_resource(inc, [], None, unsupervised=False) == "r-a1"  # the whole allocation given back: as before
    p = open_preemption(RunState("ms", 0.0, 30, incarnations=[inc]), inc, "workers terminated", "",
                        unsupervised=True)  # fmt: skip
    assert (p.queued_resource, p.zone, p.tier) == ("", "z-a", "")


def test_the_kept_slices_workers_are_waited_for_until_their_own_grace(gcs: Any, bucket: str) -> None:
    """No notice (the loss seen in the API): the wait ends when the kept slice's worker reports, not before,
    and at ``stopped_until`` when it never does."""
    layout = RunLayout.of(f"gs://{bucket}/runs", "ms")

    def report(slice_index: int, worker: int, after: float) -> threading.Thread:
        doc = {"slice": slice_index, "worker": worker, "incarnation": "0-a", "exit_code": 143}
        t = threading.Timer(after, put_json, (gcs, layout.state(f"workers/s{slice_index}-w{worker}.json"), doc))
        t.start()
        return t

    t0 = time.monotonic()
    wait_for_exit_reports(gcs, layout, "0-a", 2, [], kept={(0, 0)}, stopped_until=time.time() + 0.6)
    assert 0.5 <= time.monotonic() - t0 < 3.0  # nobody reported: the kept slice's deadline, not at once

    writer = report(0, 0, 1.0)
    t0 = time.monotonic()
    wait_for_exit_reports(gcs, layout, "0-a", 2, [], kept={(0, 0)}, stopped_until=time.time() + 30)
    writer.join()
    assert 0.9 <= time.monotonic() - t0 < 10.0  # the kept worker's report ends it; the lost slice's never came

    t0 = time.monotonic()  # a notice from the lost slice: its grace is waited for too, though the kept one is in
    notice = {"slice": 1, "worker": 0, "incarnation": "0-a", "time": time.time(), "grace_s": 0.8}
    wait_for_exit_reports(gcs, layout, "0-a", 2, [notice], kept={(0, 0)}, stopped_until=time.time() + 30)
    assert 0.7 <= time.monotonic() - t0 < 10.0


def test_a_notice_late_after_the_api_s_stop_is_waited_for_and_an_exit_report_ends_the_wait(
    gcs: Any, bucket: str
) -> None:
    """The API showed the slice stopping first: its notice is waited for (not another incarnation's); the wait
    gives up at ``within_s``, or at once when every host already reported its exit (nobody is left to save)."""
    layout = RunLayout.of(f"gs://{bucket}/runs", "late")
    put_json(gcs, layout.state("notices/worker-1.json"), {"worker": 1, "incarnation": "0-old", "time": 1.0})
    t0 = time.monotonic()
    assert await_notices(gcs, layout, "1-b", 2, within_s=0.6) == []  # the old incarnation's does not count
    assert 0.5 <= time.monotonic() - t0 < 5.0

    doc = {"worker": 0, "incarnation": "1-b", "time": time.time(), "grace_s": 25.0}
    writer = threading.Timer(0.5, put_json, (gcs, layout.state("notices/worker-0.json"), doc))
    writer.start()
    assert await_notices(gcs, layout, "1-b", 2, within_s=60.0) == [doc]  # ends when it comes
    writer.join()

    for w in (0, 1):  # every host reported (a trainer that exited before its agent wrote anything)
        put_json(gcs, layout.state(f"workers/worker-{w}.json"), {"worker": w, "incarnation": "2-c", "exit_code": 1})
    assert await_notices(gcs, layout, "2-c", 2, within_s=600.0) == []  # at once, not after 600 s


def test_stop_others_asks_every_worker_and_names_the_kept_hosts_and_their_deadline(gcs: Any, bucket: str) -> None:
    """2 slices of 2 hosts, slice 1 lost: the marker names it; slice 0's hosts are waited for until two
    heartbeats + the grace + REPORT_S from now. A stall (no slice named) or one slice: nothing kept."""
    from tpu_ops.agent.job import Job
    from tpu_ops.provision.records import Slice
    from tpu_ops.train.layout import get_json
    from tpu_ops.train.recovery import REPORT_S, stop_others

    layout = RunLayout.of(f"gs://{bucket}/runs", "ms")
    job = Job(run_id="ms", run_uri=layout.run_uri, steps=30, checkpoint_every=5, heartbeat_s=0.5, term_grace_s=4.0)
    inc = IncarnationState(0, "0-a", 0.0)
    two = [Slice("ms", f"ms-a1-{i}", f"ms-a1-{i}", "z", "spot", "v4-16", 8, 2, ("a", "b")) for i in range(2)]
    t0 = time.time()
    kept, until = stop_others(gcs, layout, job, inc, two, 1, "node PREEMPTED")
    assert kept == {(0, 0), (0, 1)} and t0 + 5.0 + REPORT_S <= until <= time.time() + 5.0 + REPORT_S
    assert get_json(gcs, layout.state("stop/0-a.json")) == {"slice": 1, "reason": "node PREEMPTED"}
    assert stop_others(gcs, layout, job, IncarnationState(1, "1-b", 0.0), two, None, "stalled") == (set(), 0.0)
    assert get_json(gcs, layout.state("stop/1-b.json")) == {"slice": None, "reason": "stalled"}
    assert stop_others(gcs, layout, job, IncarnationState(2, "2-c", 0.0), two[:1], 0, "x") == (set(), 0.0)
    assert not gcs.bucket(bucket).blob(layout.state("stop/2-c.json").prefix).exists()
