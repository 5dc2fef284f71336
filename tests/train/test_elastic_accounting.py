"""Elastic shapes in the goodput report: each shape's steps and chip-seconds, exact figures on a hand-made run."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from tpu_ops.train import goodput as G
from tpu_ops.train.runstate import IncarnationState, PreemptionState, RunState


def _steps(first: int, last: int, t0: float) -> list[list[Any]]:
    return [["step", s, t0 + i, t0 + i + 1.0] for i, s in enumerate(range(first, last + 1))]


def _run(shapes: bool) -> RunState:
    """v5p-32 ready 10-21, steps 1..6 from 13 (4 kept); preempted; v5p-16 (accumulating 2: 2 s a step)
    ready 30-40, steps 5..8 from 32 → DONE at 40."""
    inc0 = IncarnationState(
        0,
        "0-a",
        0.0,
        "r-a1",
        "z",
        "spot",
        ready_at=10.0,
        ended_at=21.0,
        end="preempted",
        kept_until=4,
        last_step=6,
        timeline=_steps(1, 6, 13.0),
    )
    slow = [["step", s, 32.0 + 2 * i, 34.0 + 2 * i] for i, s in enumerate(range(5, 9))]
    inc1 = IncarnationState(
        1,
        "1-b",
        21.5,
        "r-a1",
        "z",
        "spot",
        ready_at=30.0,
        resume_step=4,
        ended_at=40.0,
        end="done",
        kept_until=8,
        last_step=8,
        timeline=slow,
    )
    if shapes:
        inc0, inc1 = replace(inc0, shape="v5p-32", chips=16), replace(inc1, shape="v5p-16", chips=8)
    p = PreemptionState(1, 0, "preempted", "r-a1", "z", "spot", 21.0, 19.0, 6)
    return RunState("el", 0.0, 8, "done", 40.0, 8, incarnations=[inc0, inc1], preemptions=[p])


def test_each_shape_counts_its_steps_and_chip_seconds() -> None:
    doc = G.GoodputReport.derive(_run(shapes=True), now=999.0).to_json()
    assert doc["shapes"] == [
        # held 11 s x 16 chips; steps 1-4 kept, 1 s each on 16 chips
        {
            "shape": "v5p-32",
            "chips": 16,
            "incarnations": 1,
            "steps": 4,
            "held_chip_s": 176.0,
            "productive_chip_s": 64.0,
            "held_chip_s_per_step": 44.0,
        },
        # held 10 s x 8 chips; steps 5-8, 2 s each on 8 chips: the same 16 chip-seconds a step
        {
            "shape": "v5p-16",
            "chips": 8,
            "incarnations": 1,
            "steps": 4,
            "held_chip_s": 80.0,
            "productive_chip_s": 64.0,
            "held_chip_s_per_step": 20.0,
        },
    ]
    assert doc["chip_goodput"] == pytest.approx((64 + 64) / (176 + 80))
    assert G.GoodputReport.from_json(json.loads(json.dumps(doc))).to_json() == doc


def test_a_run_without_shapes_reports_as_before() -> None:
    doc = G.GoodputReport.derive(_run(shapes=False), now=999.0).to_json()
    assert "shapes" not in doc and "chip_goodput" not in doc
