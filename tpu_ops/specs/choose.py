"""How the ladder chooses among its rungs: in the written order, or by expected $ per kept step.

``ladder: auto`` in a provision spec means "every tier the slice can be bought on, in every zone,
ranked by cost" and is written out as ``ladder: [spot, on-demand]`` with ``choose: {by: cost}``;
``choose: {by: cost}`` on an explicit ladder ranks that ladder's rungs instead.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, Final, Literal

from pydantic import Field, field_validator

from tpu_ops.specs.common import Duration, GcsUri, StrictModel

AUTO: Final = "auto"
AUTO_LADDER: Final = ("spot", "on-demand")  # reservations need a name, so `auto` cannot invent one


class ChooseSpec(StrictModel):
    """Rank the ladder's rungs by expected dollars per kept training step, within a deadline."""

    by: Literal["cost"] = Field("cost", description="'cost': expected $ per kept step (from price and history).")
    auto: bool = Field(False, description="Set by `ladder: auto` (the ladder was generated, not written).")
    history: GcsUri | None = Field(
        None,
        description="gs://bucket/prefix holding past runs (their RUN/_tpu_ops/ records); "
        "default: the training job's checkpoint_dir. Without history the written order stands.",
    )
    half_life: Duration(timedelta(minutes=10), timedelta(days=365)) | None = Field(  # type: ignore[valid-type]
        None,
        description="Weigh the history by age from now: a run this long ago counts half (spot preemption rates "
        "drift with demand). Default: one day, counted from the newest run seen, and a rung whose rate changed "
        "starts again (docs/fleet.md).",
    )
    finish_by: datetime | None = Field(None, description="Deadline as a time with its zone, e.g. 2026-11-24T06:00Z.")
    max_duration: Duration(timedelta(minutes=1), timedelta(days=30)) | None = Field(  # type: ignore[valid-type]
        None, description="Deadline relative to the run's first provisioning (default: train.max_duration)."
    )
    max_miss: float = Field(
        0.1, ge=0.0, le=1.0, description="A rung whose deadline miss probability exceeds this is tried last."
    )
    wait: Duration(timedelta(seconds=1), timedelta(days=1)) | None = Field(  # type: ignore[valid-type]
        None,
        description="Patience, e.g. 10m: when every rung cheaper than on-demand is refused and on-demand would "
        "still make the deadline this much later and the expected saving beats the deadline risk it adds, wait "
        "this long and ask again instead of buying on-demand now. Default: never wait.",
    )
    queue: Duration(timedelta(seconds=1), timedelta(days=1)) | None = Field(  # type: ignore[valid-type]
        timedelta(minutes=10),
        description="With a fleet view of a named reservation (Compute Engine): when it is full, a freed VM would go "
        "to this run and its deadline leaves ample slack (half its remaining work + 1 h after the wait), wait this "
        "long and rank again instead of taking other capacity now: the reservation is paid for whether used or not "
        "(docs/fleet.md). null: never queue for it.",
    )
    move: bool = Field(
        True,
        description="A training run already placed ranks its remaining work again at each committed checkpoint and "
        "moves, make-before-break, to a rung worth leaving its slice for (capacity freed meanwhile, e.g. a "
        "reservation VM handed back; docs/moves.md). false: rank only at the start and after a preemption.",
    )
    move_every: Duration(timedelta(seconds=1), timedelta(days=1)) | None = Field(  # type: ignore[valid-type]
        timedelta(minutes=10),
        description="With move: also rank again this often between checkpoints while training. A move's handover "
        "saves the step in hand, so it need not wait for the next checkpoint (hour-long intervals would leave "
        "freed capacity idle). null: rank at committed checkpoints only.",
    )
    steps: int | None = Field(None, ge=1, description="Steps of the run (default: train.steps).")
    checkpoint_every: int | None = Field(None, ge=1, description="Steps between checkpoints (default: train's).")
    checkpoint_interval: Duration(timedelta(seconds=1), timedelta(days=7)) = Field(  # type: ignore[valid-type]
        timedelta(minutes=10), description="Time between checkpoints when the spec has no steps (a bare slice)."
    )

    @field_validator("finish_by")
    @classmethod
    def _aware(cls, v: datetime | None) -> datetime | None:
        if v is not None and v.tzinfo is None:
            raise ValueError("finish_by needs a time zone, e.g. 2026-11-24T06:00:00Z")
        return v


def expand_auto(data: Any) -> Any:
    """``ladder: auto`` → the generated ladder plus ``choose.auto`` (a before-validator of the spec)."""
    if isinstance(data, dict) and data.get("ladder") == AUTO:
        choose = data.get("choose")
        choose = dict(choose) if isinstance(choose, dict) else {}
        choose["auto"] = True
        data = {**data, "ladder": list(AUTO_LADDER), "choose": choose}
    return data
