"""Dollars per million tokens and model FLOPs utilisation (MFU) of a training run.

The figures a training team leads with, derived from what the run already records:

- **tokens** and **model FLOPs** = the kept steps (those a later incarnation did not throw away,
  as the goodput report counts them) * the per-step figures the trainer reported in its heartbeats
  (``tokens_per_step``, ``model_flops_per_step``: the job contract, ``tpu_ops.agent.job.WORK_FIELDS``);
  unknown (None) when any kept step's incarnation did not report them;
- **$ per million tokens** = the run's whole cost from the ledger (every slice, preempted and queued
  time included) / (tokens / 1e6): what a useful token cost, badput and all;
- **MFU** = model FLOPs / (productive seconds * the slice's bf16 peak FLOP/s), the peak from the
  accelerator table (``tpu_ops.accelerators.PEAK_BF16_TFLOPS``, Google's published per-chip figures);
  productive seconds are the goodput report's, so MFU measures the steps themselves, and
  **effective MFU** (over the whole wall time) = MFU * goodput.

``efficiency(state, cost, accelerator)`` is a pure function of the run's state (``state.json``), its
ledger summary and the slice shape: the run summary, the UI artifact and ``tpu-ops status`` call it
(``efficiency_line`` of its ``to_json()`` is the one line they print).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from tpu_ops.accelerators import PEAK_SOURCE, AcceleratorType, lookup
from tpu_ops.provision.ledger import RunCost
from tpu_ops.train.goodput import PRODUCTIVE, categorise, efficiency_line, intervals, kept_steps
from tpu_ops.train.runstate import RunState


@dataclass(frozen=True)
class Efficiency:
    """What the run's useful work cost and how well it used the slice."""

    accelerator: str
    peak_flops: float  # the slice's bf16 peak, FLOP/s
    steps_kept: int
    tokens: float | None  # None: the trainer did not report tokens per step
    model_flops: float | None  # None: the trainer did not report model FLOPs per step
    productive_s: float
    wall_s: float
    usd: float

    @property
    def usd_per_million_tokens(self) -> float | None:
        return self.usd / (self.tokens / 1e6) if self.tokens else None

    @property
    def mfu(self) -> float | None:
        """Model FLOPs per productive second over the slice's peak."""
        return _ratio(self.model_flops, self.productive_s * self.peak_flops)

    @property
    def effective_mfu(self) -> float | None:
        """Model FLOPs per wall-clock second over the slice's peak (MFU * goodput)."""
        return _ratio(self.model_flops, self.wall_s * self.peak_flops)

    def to_json(self) -> dict[str, Any]:
        def rounded(v: float | None) -> float | None:  # 6 significant digits: a toy model's MFU is ~1e-12
            return None if v is None else float(f"{v:.6g}")

        return {
            "accelerator": self.accelerator,
            "peak_flops": self.peak_flops,
            "peak_source": PEAK_SOURCE,
            "steps_kept": self.steps_kept,
            "tokens": self.tokens,
            "model_flops": self.model_flops,
            "usd": round(self.usd, 6),
            "usd_per_million_tokens": rounded(self.usd_per_million_tokens),
            "mfu": rounded(self.mfu),
            "effective_mfu": rounded(self.effective_mfu),
        }


def _ratio(top: float | None, bottom: float) -> float | None:
    return top / bottom if top is not None and bottom > 0 else None


def kept_work(state: RunState) -> tuple[int, float | None, float | None]:
    """(kept steps, their tokens, their model FLOPs); a figure is None unless every kept step's
    incarnation reported it. The kept steps are the goodput report's (:func:`kept_steps`)."""
    owner = kept_steps(state)

    def total(name: str) -> float | None:
        figures = [getattr(inc, name) for inc in owner.values()]
        return sum(figures) if figures and all(f is not None for f in figures) else None

    return len(owner), total("tokens_per_step"), total("model_flops_per_step")


def efficiency(
    state: RunState,
    cost: RunCost | Mapping[str, Any],
    accelerator: AcceleratorType | str,
    now: float | None = None,
    slices: int = 1,
) -> Efficiency:
    """The run's efficiency figures; a running run is measured up to ``now`` (default: the clock), its live
    slice's steps up to the newest one its heartbeats showed.

    ``cost`` is the ledger's summary (``Ledger.summary(prices)``, or its ``to_json()``, as the goodput
    report stores it); ``accelerator`` the slice shape (a table row or its name, e.g. ``v4-32``); ``slices``
    how many such slices the run's allocation holds (the peak is theirs together).
    """
    acc = lookup(accelerator) if isinstance(accelerator, str) else accelerator
    end = state.finished_at if state.finished_at is not None else (time.time() if now is None else now)
    live = state.live
    if live is not None and live.kept_until is None:
        # A running run: the live slice's steps so far count (the report keeps them only once it ends).
        state = replace(state, incarnations=[*state.incarnations[:-1], replace(live, kept_until=live.last_step)])
    productive = categorise(intervals(state, end), state.started_at, end)[PRODUCTIVE]
    usd = cost.usd_total if isinstance(cost, RunCost) else float(cost.get("usd_total", 0.0))
    steps, tokens, flops = kept_work(state)
    return Efficiency(
        accelerator=acc.name, peak_flops=acc.peak_flops * slices, steps_kept=steps, tokens=tokens, model_flops=flops,
        productive_s=productive, wall_s=max(0.0, end - state.started_at), usd=usd,
    )  # fmt: skip


__all__ = ["Efficiency", "efficiency", "efficiency_line", "kept_work"]
