"""Capacity of the fake Compute Engine: TPU chips per zone and provisioning model, reservations
(a number of VMs of one machine type, as Compute Engine counts them), the TPU chips calendar-mode
future reservations may book per zone and TPU generation at any moment (``CALENDAR``: what
Google's review of a calendar request weighs, :mod:`.futures`) and regional TPU quotas.

Usage is not stored here: the backend derives it from the instances that hold capacity.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from infra.local.compute.machines import MACHINE_TYPES

MODELS = ("STANDARD", "SPOT", "FLEX_START")
DEFAULT_CHIPS = 4096
CALENDAR = "CALENDAR"
GENERATIONS = sorted({m.generation for m in MACHINE_TYPES.values()})


@dataclass
class Reservation:
    count: int  # VMs
    machine_type: str


@dataclass
class ZoneCapacity:
    chips: dict[str, int] = field(default_factory=lambda: dict.fromkeys(MODELS, DEFAULT_CHIPS))
    reservations: dict[str, Reservation] = field(default_factory=dict)
    # TPU generation ("*": any other) -> chips calendar-mode requests may hold at one moment
    calendar: dict[str, int] = field(default_factory=lambda: {"*": DEFAULT_CHIPS})

    def calendar_chips(self, generation: str) -> int:
        return self.calendar.get(generation, self.calendar.get("*", DEFAULT_CHIPS))

    def _set_calendar(self, value: Any) -> None:
        """``chips`` (every generation) or ``{"v5p"|"v6e"|"tpu7x"|"*": chips}`` (merged)."""
        if not isinstance(value, dict):
            self.calendar = {"*": int(value)}
            return
        bad = sorted(set(value) - {*GENERATIONS, "*"})
        if bad:
            raise ValueError(f"capacity: unknown {CALENDAR} key(s) {bad}; expected one of {[*GENERATIONS, '*']}")
        self.calendar.update({str(k): int(v) for k, v in value.items()})

    def update(self, d: dict[str, Any]) -> None:
        for key, value in d.items():
            if key in MODELS:
                self.chips[key] = int(value)
            elif key == CALENDAR:
                self._set_calendar(value)
            elif key == "reservations":
                self.reservations = {
                    str(name): Reservation(int(r["count"]), str(r["machineType"])) for name, r in dict(value).items()
                }
            else:
                keys = [*MODELS, CALENDAR, "reservations"]
                raise ValueError(f"capacity: unknown key {key!r}; expected one of {keys}")

    def to_json(self) -> dict[str, Any]:
        res = {n: {"count": r.count, "machineType": r.machine_type} for n, r in sorted(self.reservations.items())}
        return {**self.chips, CALENDAR: dict(sorted(self.calendar.items())), "reservations": res}


class Capacity:
    """Configured capacity per zone (``"*"``: the default for zones not named) and quotas per region."""

    def __init__(self) -> None:
        self.default = ZoneCapacity()
        self.zones: dict[str, ZoneCapacity] = {}
        self.quotas: dict[str, dict[str, int]] = {}  # region -> metric -> limit (chips)

    def configure(self, spec: dict[str, Any]) -> None:
        """``{"<zone>"|"*": {"STANDARD"|"SPOT"|"FLEX_START": chips, "CALENDAR": chips | {generation: chips},
        "reservations": {name: {count, machineType}}}}``."""
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
