"""$ per million tokens and MFU: exact figures for a known run (a fixed ledger and heartbeats), the
agent's part of the contract, the reference trainer's figures and the peak-FLOPs column."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tpu_ops.accelerators import ACCELERATOR_TYPES, PEAK_BF16_TFLOPS, lookup
from tpu_ops.agent.goodput_hooks import StepTimeline, record
from tpu_ops.agent.job import WORK_FIELDS
from tpu_ops.provision import ledger as L
from tpu_ops.provision.prices import PriceTable
from tpu_ops.train.efficiency import efficiency, kept_work
from tpu_ops.train.goodput import GoodputReport, efficiency_line
from tpu_ops.train.incarnations import absorb_heartbeats
from tpu_ops.train.reference import step_work
from tpu_ops.train.runstate import IncarnationState, PreemptionState, RunState

TABLE = PriceTable(date="2030-01-02", source="test table", rates={"v4": {"spot": 1.5, "on-demand": 3.25}},
                   origin="test")  # fmt: skip


def _steps(first: int, last: int, t0: float) -> list[list[Any]]:
    return [["step", s, t0 + i, t0 + i + 1.0] for i, s in enumerate(range(first, last + 1))]


def known_run() -> RunState:
    """A v4-8 run: slice 0 ready at 10, steps 1-6 (1 s each from 13), preempted; steps 5-6 thrown away
    (it resumed from 4). Slice 1 ready at 30, steps 5-8 from 33, done at 38. 8 steps kept, 8 s productive.
    No work figures yet: the heartbeats bring them."""
    inc0 = IncarnationState(0, "0-a", 0.0, "r-a", "z", "spot", ready_at=10.0, ended_at=21.0, end="preempted",
                            kept_until=4, last_step=6, timeline=_steps(1, 6, 13.0))  # fmt: skip
    inc1 = IncarnationState(1, "1-b", 21.5, "r-a", "z", "spot", ready_at=30.0, resume_step=4, ended_at=38.0,
                            end="done", kept_until=8, last_step=8, timeline=_steps(5, 8, 33.0))  # fmt: skip
    p = PreemptionState(1, 0, "SUSPENDED", "r-a", "z", "spot", 21.0, 19.0, 6)
    return RunState("eff", 0.0, 8, "done", 38.0, 8, incarnations=[inc0, inc1], preemptions=[p])


# The ledger of the same run: 4 chips of v4 spot, held 10→24 (preempted at 21, deleted by 24), then 30→40.
LEDGER = [
    {"kind": L.ACTIVE, "resource_id": "r-a", "t": 10.0, "zone": "z", "tier": "spot", "chips": 4, "generation": "v4"},
    {"kind": L.PREEMPTED, "resource_id": "r-a", "t": 21.0},
    {"kind": L.DELETE_REQUESTED, "resource_id": "r-a", "t": 22.0},
    {"kind": L.GONE, "resource_id": "r-a", "t": 24.0},
    {"kind": L.ACTIVE, "resource_id": "r-a", "t": 30.0, "zone": "z", "tier": "spot", "chips": 4, "generation": "v4"},
    {"kind": L.DELETE_REQUESTED, "resource_id": "r-a", "t": 38.0},
    {"kind": L.GONE, "resource_id": "r-a", "t": 40.0},
]


def beat(worker: int, inc: str, **work: float) -> dict[str, Any]:
    return {"worker": worker, "incarnation": inc, "step": 6, "time": 20.0, **work}


def with_heartbeats(state: RunState) -> RunState:
    """Worker 0 of slice 0 says 5,000 tokens and 1.1e14 model FLOPs a step; slice 1 (a bigger batch) twice
    that. Worker 1's figures are not the contract's (only worker 0 speaks for the slice)."""
    inc0, inc1 = state.incarnations
    absorb_heartbeats(inc0, [beat(0, "0-a", tokens_per_step=5000, model_flops_per_step=1.1e14),
                             beat(1, "0-a", tokens_per_step=1, model_flops_per_step=1)])  # fmt: skip
    absorb_heartbeats(inc1, [beat(0, "1-b", tokens_per_step=10000, model_flops_per_step=2.2e14)])
    return state


def test_dollars_per_million_tokens_and_mfu_of_a_known_run_exactly() -> None:
    state = with_heartbeats(known_run())
    cost = L.summarise("eff", LEDGER, TABLE, now=100.0)
    # 4 chips x (14 s + 10 s) = 96 chip-seconds of spot at $1.50 per chip-hour
    assert cost.usd_total == pytest.approx(0.04, abs=1e-15)
    eff = efficiency(state, cost, lookup("v4-8"))
    assert eff.peak_flops == 4 * 275e12  # v4-8: 4 chips of 275 bf16 TFLOP/s
    assert (eff.steps_kept, eff.productive_s, eff.wall_s) == (8, 8.0, 38.0)
    # kept: steps 1-4 of slice 0 (5,000 tokens each; its steps 5 and 6 were thrown away) and 5-8 of slice 1
    assert (eff.tokens, eff.model_flops) == (4 * 5000 + 4 * 10000, 4 * 1.1e14 + 4 * 2.2e14)
    assert eff.usd_per_million_tokens == pytest.approx(0.04 / 0.06, rel=1e-12)  # $0.666667 per M tokens
    assert eff.mfu == pytest.approx(1.32e15 / (8.0 * 1.1e15), rel=1e-12)  # 15% while stepping
    assert eff.effective_mfu == pytest.approx(1.32e15 / (38.0 * 1.1e15), rel=1e-12)  # = MFU x goodput 8/38
    doc = eff.to_json()
    assert (doc["usd_per_million_tokens"], doc["mfu"], doc["effective_mfu"]) == (0.666667, 0.15, 0.0315789)
    assert "TPU v4" in doc["peak_source"] and "TPU7x" in doc["peak_source"]
    # the stored cost (as the goodput report keeps it) gives the same figures, and so does the table name
    assert efficiency(state, cost.to_json(), "v4-8") == eff
    # a multislice allocation's peak is every slice's: the same work on 2 slices is half the MFU
    two = efficiency(state, cost, "v4-8", slices=2)
    assert two.peak_flops == 2 * eff.peak_flops and two.mfu == pytest.approx(eff.mfu / 2, rel=1e-12)

    # The run summary (goodput.json and its one line) carries them beside goodput.
    report = GoodputReport.derive(state, now=100.0, cost=cost.to_json())
    report.efficiency = doc
    stored = json.loads(json.dumps(report.to_json()))
    assert stored["efficiency"] == doc and GoodputReport.from_json(stored).to_json() == stored
    assert report.summary().endswith(
        "; $0.6667 per million tokens, MFU 15.00% of the v4-8 bf16 peak (3.16% over the wall time)"
    )


def test_without_figures_from_every_kept_incarnation_there_is_no_figure() -> None:
    state = known_run()
    absorb_heartbeats(state.incarnations[1], [beat(0, "1-b", tokens_per_step=10000)])
    steps, tokens, flops = kept_work(state)
    assert (steps, tokens, flops) == (8, None, None)  # slice 0's kept steps are unaccounted for
    eff = efficiency(state, {"usd_total": 0.04}, "v4-8")
    assert (eff.usd_per_million_tokens, eff.mfu, eff.effective_mfu) == (None, None, None)
    assert efficiency_line(eff.to_json()) == ""
    report = GoodputReport.derive(state, now=100.0)
    assert "efficiency" not in report.to_json() and "MFU" not in report.summary()


def test_a_failed_run_counts_only_the_steps_it_kept_and_a_running_run_its_steps_so_far() -> None:
    failed = with_heartbeats(known_run())
    inc1 = failed.incarnations[1]
    inc1.end, inc1.kept_until, failed.outcome, failed.final_step = "failed", 6, "failed", 6  # 7, 8 never saved
    eff = efficiency(failed, {"usd_total": 0.04}, "v4-8")
    assert (eff.steps_kept, eff.tokens, eff.productive_s) == (6, 4 * 5000 + 2 * 10000, 6.0)
    assert eff.usd_per_million_tokens == pytest.approx(0.04 / 0.04, rel=1e-12)

    running = with_heartbeats(known_run())
    inc1 = running.incarnations[1]
    inc1.end, inc1.ended_at, inc1.kept_until, inc1.last_step = "", None, None, 7
    inc1.timeline = inc1.timeline[:3]  # steps 5-7 so far
    running.outcome, running.finished_at, running.final_step = "running", None, None
    eff = efficiency(running, {"usd_total": 0.04}, "v4-8", now=40.0)
    assert (eff.steps_kept, eff.tokens, eff.productive_s, eff.wall_s) == (7, 4 * 5000 + 3 * 10000, 7.0, 40.0)
    assert eff.mfu == pytest.approx((4 * 1.1e14 + 3 * 2.2e14) / (7.0 * 1.1e15), rel=1e-12)
    assert running.incarnations[1].kept_until is None  # the caller's state is left as it was


def test_the_agent_carries_the_trainers_newest_figures_in_worker_0s_heartbeat(tmp_path: Path) -> None:
    timeline = StepTimeline(tmp_path, worker=0)
    log = timeline.env()["TPU_OPS_STEP_LOG"]
    record(log, "step", 1, 0.0, 1.0, tokens=1088, flops=6528)
    record(log, "save", 1, 1.0, 1.5)
    record(log, "step", 2, 1.5, 2.5, tokens=2176, flops=13056)  # the newest figures win
    with open(log, "a") as f:  # not a number, or not positive: ignored
        f.write(json.dumps({"kind": "step", "step": 3, "start": 3, "end": 4, "tokens": "many", "flops": -1}) + "\n")
    fields = timeline.heartbeat_fields()
    assert {k: fields[k] for k in WORK_FIELDS} == {"tokens_per_step": 2176.0, "model_flops_per_step": 13056.0}
    assert len(fields["timeline"]) == 4
    (tmp_path / "w1").mkdir()
    other = StepTimeline(tmp_path / "w1", worker=1)  # other workers' heartbeats carry neither
    record(other.env()["TPU_OPS_STEP_LOG"], "step", 1, 0.0, 1.0, tokens=1088, flops=6528)
    assert other.heartbeat_fields() == {}


def test_the_reference_trainer_reports_tokens_and_flops_of_its_model() -> None:
    # 16 features + a bias = 17 parameters; an example is a window of 17 tokens predicting one
    assert step_work(features=16, batch=64) == (64 * 17, 6 * 17 * 64)


def test_every_accelerator_has_googles_published_peak() -> None:
    assert PEAK_BF16_TFLOPS == {"v4": 275.0, "v5e": 197.0, "v5p": 459.0, "v6e": 918.0, "tpu7x": 2307.0}
    for acc in ACCELERATOR_TYPES.values():
        assert acc.peak_flops == acc.chips * PEAK_BF16_TFLOPS[acc.generation] * 1e12
    assert lookup("v5p-128").peak_flops == 64 * 459e12  # 128 TensorCores = 64 chips


def test_steps_a_checkpoint_proves_count_as_in_the_goodput_report_when_their_records_are_lost() -> None:
    # Slice 0's VM went before its last heartbeat: its records stop at step 2, but its checkpoint at 4 was
    # committed (slice 1 resumed from it). Seen on a loaded machine: goodput said 8 steps kept, efficiency 6.
    state = with_heartbeats(known_run())
    state.incarnations[0].timeline = state.incarnations[0].timeline[:2]
    steps, tokens, flops = kept_work(state)
    assert steps == GoodputReport.derive(state, now=100.0).steps_kept == 8
    assert (tokens, flops) == (4 * 5000 + 4 * 10000, 4 * 1.1e14 + 4 * 2.2e14)
    assert efficiency(state, {"usd_total": 0.04}, "v4-8").productive_s == 6.0  # only recorded seconds are productive
