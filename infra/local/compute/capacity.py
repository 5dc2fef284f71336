"""Capacity of the fake Compute Engine: TPU chips per zone and provisioning model, reservations
(a number of VMs of one machine type, as Compute Engine counts them) and regional TPU quotas.

Usage is not stored here: the backend derives it from the instances that hold capacity.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

MODELS = ("STANDARD", "SPOT", "FLEX_START")
DEFAULT_CHIPS = 4096


@dataclass
class Reservation:
    count: int  # VMs
    machine_type: str


@dataclass
class ZoneCapacity:
    chips: dict[str, int] = field(default_factory=lambda: dict.fromkeys(MODELS, DEFAULT_CHIPS))
    reservations: dict[str, Reservation] = field(default_factory=dict)

    def update(self, d: dict[str, Any]) -> None:
        for key, value in d.items():
            if key in MODELS:
                self.chips[key] = int(value)
            elif key == "reservations":
                self.reservations = {
                    str(name): Reservation(int(r["count"]), str(r["machineType"])) for name, r in dict(value).items()
                }
            else:
                raise ValueError(f"capacity: unknown key {key!r}; expected one of {[*MODELS, 'reservations']}")

    def to_json(self) -> dict[str, Any]:
        res = {n: {"count": r.count, "machineType": r.machine_type} for n, r in sorted(self.reservations.items())}
        return {**self.chips, "reservations": res}


class Capacity:
    """Configured capacity per zone (``"*"``: the default for zones not named) and quotas per region."""

    def __init__(self) -> None:
        self.default = ZoneCapacity()
        self.zones: dict[str, ZoneCapacity] = {}
        self.quotas: dict[str, dict[str, int]] = {}  # region -> metric -> limit (chips)

    def configure(self, spec: dict[str, Any]) -> None:
        """``{"<zone>"|"*": {"STANDARD"|"SPOT"|"FLEX_START": chips, "reservations": {name: {count, machineType}}}}``."""
        for zone, d in spec.items():
            if zone == "*":
                self.default.update(dict(d))
            else:
                cur = self.zone(zone)
                cur.update(dict(d))
                self.zones[zone] = cur

    def set_quotas(self, spec: dict[str, dict[str, int]]) -> None:
        """``{"<region>": {"TPU_PODSLICE_V5P": chips, ...}}``; a metric not set is unlimited-ish (4096)."""
        for region, metrics in spec.items():
            self.quotas.setdefault(region, {}).update({str(k): int(v) for k, v in metrics.items()})

    def zone(self, zone: str) -> ZoneCapacity:
        return self.zones.get(zone) or copy.deepcopy(self.default)

    def quota(self, region: str, metric: str) -> int:
        return self.quotas.get(region, {}).get(metric, DEFAULT_CHIPS)

    def reset(self) -> None:
        self.__init__()  # type: ignore[misc]

    def to_json(self) -> dict[str, Any]:
        out = {z: c.to_json() for z, c in sorted(self.zones.items())}
        out["*"] = self.default.to_json()
        return {"zones": out, "quotas": copy.deepcopy(self.quotas)}
