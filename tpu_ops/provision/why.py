"""The sentences of a ranking: why each rung sits where it does (:func:`tpu_ops.provision.choose.rank`)."""

from __future__ import annotations

import math
from typing import Any

# Expectations are duck-typed here (``tpu_ops.provision.choose.Expectation``): importing that module,
# even for types, would make an import cycle.
Expectation = Any


def why(e: Expectation, ok: list[Expectation], near: list[Expectation], deadline: str, tie: float) -> str:
    """Why an eligible rung sits where it does."""
    first = ok[0]
    cheapest = min(ok, key=lambda x: (x.usd_per_step, x.rung.order))
    if e is first and e is cheapest:
        return f"cheapest per kept step{deadline}"
    if e is first:
        return (f"within {tie:.0%} of the cheapest per kept step{deadline}, and the least steady of those: "
                "steadier capacity is left to runs that need it more")  # fmt: skip
    if any(e is n for n in near):
        times = ratio(e.usd_per_step, first.usd_per_step)
        return f"{times} the cost per kept step of {first.rung.label()}: a tie, steadier, tried after it"
    return f"{ratio(e.usd_per_step, cheapest.usd_per_step)} the cost per kept step of {cheapest.rung.label()}"


def scarce(e: Expectation) -> str:
    """What scarcity added to a rung's figure, when it added anything."""
    if e.scarcity_usd <= 0 or math.isinf(e.scarcity_usd):
        return ""
    return f" (scarce: {e.belief.full:.0%} of requests refused, +${e.scarcity_usd:.2f} included)"


def ratio(a: float, b: float) -> str:
    if math.isinf(a):
        return "never finishes on average; infinitely more than"
    if b <= 0:
        return "more than"
    return f"{a / b:.2f}x"
