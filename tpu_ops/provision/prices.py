"""The price table: dollars per chip-hour by TPU generation and tier, with its date and source.

The shipped table is ``prices.json`` next to this module; ``Settings.price_table`` points at a JSON
file of the same shape that replaces it (a company's negotiated rates, another region).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Final

from tpu_ops.accelerators import GENERATIONS
from tpu_ops.errors import ConfigError, SpecError
from tpu_ops.settings import Settings
from tpu_ops.tiers import Tier

# capacity tiers, then the prices of 1- and 3-year commitments (what `tpu-ops cost` compares)
TIERS: Final = (*(t.value for t in Tier), "commit-1y", "commit-3y")
SHIPPED: Final = "prices.json"


@dataclass(frozen=True)
class PriceTable:
    """Dollars per chip-hour, keyed by generation then tier."""

    date: str
    source: str
    rates: dict[str, dict[str, float]]
    origin: str = "shipped"

    def price(self, generation: str, tier: str) -> float:
        """Dollars per chip-hour for ``generation`` on ``tier``."""
        try:
            return self.rates[generation][tier]
        except KeyError:
            raise ConfigError(
                f"price table ({self.origin}) has no price for {generation} {tier}; "
                f"it covers {sorted(self.rates)} x {list(TIERS)}"
            ) from None

    @classmethod
    def from_json(cls, data: Any, origin: str) -> PriceTable:
        if not isinstance(data, dict):
            raise ConfigError(f"price table {origin}: expected a JSON object")
        missing = [k for k in ("date", "source", "generations") if k not in data]
        if missing:
            raise ConfigError(f"price table {origin}: missing {', '.join(missing)} (date and source are required)")
        rates: dict[str, dict[str, float]] = {}
        for gen, row in dict(data["generations"]).items():
            if gen not in GENERATIONS:
                raise ConfigError(f"price table {origin}: unknown generation {gen!r}; known: {list(GENERATIONS)}")
            rates[gen] = {}
            for tier, value in dict(row).items():
                if tier not in TIERS:
                    raise ConfigError(f"price table {origin}: {gen}: unknown tier {tier!r}; known: {list(TIERS)}")
                if not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
                    raise ConfigError(f"price table {origin}: {gen} {tier}: {value!r} is not a price ≥ 0")
                rates[gen][tier] = float(value)
        return cls(date=str(data["date"]), source=str(data["source"]), rates=rates, origin=origin)


def shipped() -> PriceTable:
    """The table shipped with tpu-ops."""
    text = resources.files("tpu_ops.provision").joinpath(SHIPPED).read_text(encoding="utf-8")
    return PriceTable.from_json(json.loads(text), origin=f"tpu_ops/provision/{SHIPPED}")


def load(settings: Settings | None = None, path: Path | None = None) -> PriceTable:
    """``path``, else ``settings.price_table``, else the shipped table."""
    path = path or (settings.price_table if settings else None)
    if path is None:
        return shipped()
    from tpu_ops.specs.loader import read_document

    path = Path(path)
    if not path.exists():
        raise ConfigError(f"price table {path} does not exist")
    try:
        data = read_document(path)  # bounded and strict, like a spec
    except SpecError as exc:
        raise ConfigError(f"price table {exc}") from None
    return PriceTable.from_json(data, origin=str(path))
