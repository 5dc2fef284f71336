"""Per-zone TPU capacity: spot chips, on-demand chips and named reservations (chips each).

Usage is not stored here: the backend derives it from the nodes that exist (a PREEMPTED or
DELETING node still holds its chips until it is gone, as on Google Cloud).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from tpu_ops.tiers import Tier

Pool = tuple[Tier, str]  # (tier, reservation name or "")


@dataclass
class ZoneCapacity:
    spot: int = 4096
    on_demand: int = 4096
    reservations: dict[str, int] = field(default_factory=dict)

    @classmethod
    def from_json(cls, d: dict[str, Any], base: ZoneCapacity | None = None) -> ZoneCapacity:
        cur = copy.deepcopy(base) if base else cls()
        if Tier.SPOT in d:
            cur.spot = int(d[Tier.SPOT])
        if Tier.ON_DEMAND in d:
            cur.on_demand = int(d[Tier.ON_DEMAND])
        if "reservations" in d:
            cur.reservations = {str(k): int(v) for k, v in dict(d["reservations"]).items()}
        return cur

    def to_json(self) -> dict[str, Any]:
        return {
            Tier.SPOT.value: self.spot,
            Tier.ON_DEMAND.value: self.on_demand,
            "reservations": dict(self.reservations),
        }

    def size(self, pool: Pool) -> int:
        kind, name = pool
        if kind == Tier.SPOT:
            return self.spot
        if kind == Tier.ON_DEMAND:
            return self.on_demand
        return self.reservations.get(name, 0)


class Capacity:
    """Configured capacity per zone; zones not configured get the default (generous) one."""

    def __init__(self, default: ZoneCapacity | None = None) -> None:
        self.default = default or ZoneCapacity()
        self.zones: dict[str, ZoneCapacity] = {}

    def configure(self, spec: dict[str, Any]) -> None:
        """``{"<zone>" | "*": {"spot": n, "on-demand": n, "reservations": {name: chips}}}``.

        Each zone named is updated field by field; ``"*"`` changes the default for other zones.
        """
        for zone, d in spec.items():
            if zone == "*":
                self.default = ZoneCapacity.from_json(d, self.default)
            else:
                self.zones[zone] = ZoneCapacity.from_json(d, self.zone(zone))

    def zone(self, zone: str) -> ZoneCapacity:
        return self.zones.get(zone) or copy.deepcopy(self.default)

    def has_reservation(self, zone: str, name: str) -> bool:
        res = self.zone(zone).reservations
        return bool(res) if name == "-" else name in res

    def candidates(self, zone: str, kind: Tier, reservation: str = "") -> list[Pool]:
        """Pools a request of this tier may draw from (``-`` = any reservation in the zone)."""
        if kind != Tier.RESERVATION:
            return [(kind, "")]
        names = sorted(self.zone(zone).reservations) if reservation == "-" else [reservation]
        return [(Tier.RESERVATION, n) for n in names]

    def to_json(self) -> dict[str, Any]:
        out = {z: c.to_json() for z, c in sorted(self.zones.items())}
        out["*"] = self.default.to_json()
        return out
