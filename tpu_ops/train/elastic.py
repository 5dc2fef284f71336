"""Elastic shapes in a run's accounting: what each shape did, in steps and chip-seconds (docs/elastic.md).

A run with ``provision.slice.shapes`` may train part of the way on a smaller shape (with gradient
accumulation, so a step is the target shape's). Seconds alone would overstate such a stretch (a step
there takes longer on fewer chips), so each incarnation counts in chip-seconds: its chips times the
time it held them, and times the time its kept steps took. ``shape_rows`` gives one row per shape used,
``chip_goodput`` the run's productive chip-seconds over the chip-seconds it held.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from tpu_ops.train.runstate import IncarnationState


def steps_kept(inc: IncarnationState) -> int:
    """The steps of ``inc`` the run kept (``resume < step ≤ kept_until``)."""
    if inc.kept_until is None:
        return 0
    return max(0, inc.kept_until - (inc.resume_step or 0))


def held_s(inc: IncarnationState, end: float) -> float:
    """Seconds ``inc`` held its allocation: ready → ended (or ``end`` while live)."""
    if inc.ready_at is None:
        return 0.0
    return max(0.0, (inc.ended_at if inc.ended_at is not None else end) - inc.ready_at)


def shape_rows(
    incarnations: Sequence[IncarnationState], end: float, productive_s: Callable[[IncarnationState], float]
) -> list[dict[str, Any]]:
    """One row per shape used, in order of first use: incarnations, steps kept, and chip-seconds held and
    productive (``productive_s(inc)``: the seconds of ``inc``'s kept steps); empty for a run without shapes."""
    rows: dict[str, dict[str, Any]] = {}
    for inc in incarnations:
        if not inc.shape:
            continue
        row = rows.setdefault(
            inc.shape,
            {
                "shape": inc.shape,
                "chips": inc.chips,
                "incarnations": 0,
                "steps": 0,
                "held_chip_s": 0.0,
                "productive_chip_s": 0.0,
            },
        )
        row["incarnations"] += 1
        row["steps"] += steps_kept(inc)
        row["held_chip_s"] += inc.chips * held_s(inc, end)
        row["productive_chip_s"] += inc.chips * productive_s(inc)
    out = []
    for row in rows.values():
        per = row["held_chip_s"] / row["steps"] if row["steps"] else None
        out.append(
            {
                **row,
                "held_chip_s": round(row["held_chip_s"], 3),
                "productive_chip_s": round(row["productive_chip_s"], 3),
                "held_chip_s_per_step": None if per is None else round(per, 3),
            }
        )
    return out


def chip_goodput(rows: Sequence[dict[str, Any]]) -> float | None:
    """Productive chip-seconds over chip-seconds held, over every shape (None when nothing was held)."""
    held = sum(float(r["held_chip_s"]) for r in rows)
    return round(sum(float(r["productive_chip_s"]) for r in rows) / held, 4) if held > 0 else None
