"""Capacity tiers: the one spelling of each, used by specs, the TPU adapter, prices and ledgers."""

from __future__ import annotations

from enum import StrEnum


class Tier(StrEnum):
    """Where a slice's capacity comes from; the value is what specs, labels and price tables say."""

    RESERVATION = "reservation"  # a named reservation in one zone
    SPOT = "spot"  # cheapest, preemptible without notice
    ON_DEMAND = "on-demand"  # the last resort

    @classmethod
    def names(cls) -> str:
        """``'reservation', 'spot' or 'on-demand'``, for error messages."""
        quoted = [f"'{t.value}'" for t in cls]
        return ", ".join(quoted[:-1]) + " or " + quoted[-1]
