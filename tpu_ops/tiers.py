"""Capacity tiers and control planes: the one spelling of each, used by specs, adapters, prices, ledgers."""

from __future__ import annotations

from enum import StrEnum
from typing import Final


class Tier(StrEnum):
    """Where a slice's capacity comes from; the value is what specs, labels and price tables say."""

    RESERVATION = "reservation"  # a named reservation in one zone
    SPOT = "spot"  # cheapest, preemptible without notice
    ON_DEMAND = "on-demand"  # the last resort
    # Compute Engine's queued capacity for a bounded run time (provisioningModel FLEX_START).
    FLEX_START = "flex-start"
    # A calendar-mode (future) reservation on Compute Engine: capacity for a fixed window, consumed
    # through a resize request on a group over a RESERVATION_BOUND template (docs/calendar.md).
    CALENDAR = "calendar"

    @classmethod
    def names(cls) -> str:
        """``'reservation', 'spot', 'on-demand', 'flex-start' or 'calendar'``, for error messages."""
        quoted = [f"'{t.value}'" for t in cls]
        return ", ".join(quoted[:-1]) + " or " + quoted[-1]


class Backend(StrEnum):
    """The control plane a slice is provisioned through."""

    TPU_API = "tpu-api"  # Cloud TPU API queued resources (frozen by Google: fixes only)
    COMPUTE = "compute"  # Compute Engine instances / managed instance groups


# What each control plane can serve: tiers, and TPU generations.
BACKEND_TIERS: Final[dict[str, frozenset[str]]] = {
    Backend.TPU_API: frozenset({Tier.RESERVATION, Tier.SPOT, Tier.ON_DEMAND}),
    Backend.COMPUTE: frozenset(Tier),
}
BACKEND_GENERATIONS: Final[dict[str, frozenset[str]]] = {
    Backend.TPU_API: frozenset({"v4", "v5e", "v5p", "v6e"}),
    Backend.COMPUTE: frozenset({"v5p", "v6e", "tpu7x"}),
}
