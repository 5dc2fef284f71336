"""Cost arithmetic: budget estimates before provisioning and the what-if questions of ``tpu-ops cost``.

Prices are per chip-hour. The chip count comes from the accelerator table (``v5p-128`` is 64 chips:
its suffix counts TensorCores), or is given directly. All money is in dollars, rounded to cents
only for display.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from tpu_ops.errors import BudgetError, SpecError
from tpu_ops.provision.prices import PriceTable
from tpu_ops.specs.slice import ProvisionSpec
from tpu_ops.tiers import Tier

HOURS_PER_YEAR = 8760.0


@dataclass(frozen=True)
class RungEstimate:
    tier: Tier
    reservation: str
    usd_per_chip_hour: float
    usd: float


@dataclass(frozen=True)
class Estimate:
    """What a provisioning request may cost: per rung, and the worst case the ladder can land on."""

    accelerator_type: str
    chips: int
    hours: float
    rungs: tuple[RungEstimate, ...]
    worst_usd: float
    price_date: str
    price_source: str

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["rungs"] = [asdict(r) for r in self.rungs]
        return d


def estimate(spec: ProvisionSpec, table: PriceTable) -> Estimate:
    """Chips x hours x price for every rung; the worst case is what the budget must cover."""
    acc = spec.slice.accelerator
    rows = []
    for rung in spec.ladder:
        tier = rung.kind
        price = table.price(acc.generation, tier)
        name = rung.short_name
        rows.append(RungEstimate(tier, name, price, acc.chips * spec.hours * price))
    worst = max(r.usd for r in rows)
    return Estimate(acc.name, acc.chips, spec.hours, tuple(rows), worst, table.date, table.source)


def check_budget(spec: ProvisionSpec, table: PriceTable, field: str = "budget_usd") -> Estimate:
    """Return the estimate, or raise ``BudgetError`` (with both numbers and the fix) if it exceeds the budget.

    Any rung may be the one that wins, so the most expensive rung must fit the budget. ``field`` is
    where the budget sits in the spec the user wrote (``provision.budget_usd`` in a pipeline), so the
    fix names it.
    """
    est = estimate(spec, table)
    budget = float(spec.budget_usd)
    if est.worst_usd > budget + 1e-9:
        worst = max(est.rungs, key=lambda r: r.usd)
        hours = field.removesuffix("budget_usd") + "hours"
        err = BudgetError(
            f"over budget: estimated cost ${est.worst_usd:,.2f} exceeds the budget ${budget:,.2f}: {est.chips} "
            f"chips ({est.accelerator_type}) x {est.hours:g} h x ${worst.usd_per_chip_hour:g}/chip-hour on the "
            f"{worst.tier} rung (prices of {table.date})",
            estimate_usd=round(est.worst_usd, 2),
            budget_usd=budget,
        )
        err.fix = (
            f"raise {field} to at least ${est.worst_usd:,.2f}, or shrink the run: fewer {hours}, "
            f"a smaller slice, or drop the {worst.tier} rung"
        )
        raise err
    return est


def budget_line(err: BudgetError) -> str:
    """The one line a person reads for an over-budget run: the figures, then the fix."""
    return f"{err} — fix: {err.fix}" if err.fix else str(err)


# -- what-if arithmetic for `tpu-ops cost` ---------------------------------------------------


def hourly_usd(chips: int, usd_per_chip_hour: float) -> float:
    """Dollars per hour for ``chips`` at a chip-hour price (64 chips x $8 = $512/h)."""
    if chips <= 0:
        raise SpecError(f"chips must be positive, not {chips}")
    if usd_per_chip_hour < 0:
        raise SpecError(f"price must be ≥ 0, not {usd_per_chip_hour}")
    return chips * usd_per_chip_hour


def compare_tiers(chips: int, hours: float, generation: str, table: PriceTable) -> dict[str, dict[str, float]]:
    """For each tier the table prices: $/chip-hour, $/hour and $ total for ``chips`` x ``hours``."""
    out: dict[str, dict[str, float]] = {}
    for tier, price in table.rates.get(generation, {}).items():
        per_hour = hourly_usd(chips, price)
        out[tier] = {"usd_per_chip_hour": price, "usd_per_hour": per_hour, "usd": per_hour * hours}
    if not out:
        table.price(generation, Tier.ON_DEMAND)  # raises a ConfigError naming what the table covers
    return out


@dataclass(frozen=True)
class CommitmentQuote:
    """A 1- or 3-year commitment against paying on-demand for the hours actually used."""

    years: int
    chips: int
    utilisation: float
    on_demand_usd: float  # on-demand price x chips x hours used
    commit_usd: float  # committed price x chips x every hour of the term
    savings_usd: float
    savings_pct: float
    break_even_utilisation: float  # below this, on-demand is cheaper

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def commitment_savings(
    chips: int, generation: str, utilisation: float, years: int, table: PriceTable
) -> CommitmentQuote:
    """Savings of a ``years``-year commitment when the chips are busy ``utilisation`` of the time."""
    if years not in (1, 3):
        raise SpecError(f"commitments are 1 or 3 years, not {years}")
    if not 0 < utilisation <= 1:
        raise SpecError(f"utilisation must be in (0, 1], not {utilisation}")
    od = table.price(generation, Tier.ON_DEMAND)
    cud = table.price(generation, f"commit-{years}y")
    hours = HOURS_PER_YEAR * years
    on_demand = chips * od * hours * utilisation
    commit = chips * cud * hours
    savings = on_demand - commit
    return CommitmentQuote(
        years=years,
        chips=chips,
        utilisation=utilisation,
        on_demand_usd=on_demand,
        commit_usd=commit,
        savings_usd=savings,
        savings_pct=100.0 * savings / on_demand if on_demand else 0.0,
        break_even_utilisation=cud / od if od else 0.0,
    )


def usd_per_million_tokens(usd_per_hour: float, tokens_per_second: float) -> float:
    """Dollars per million tokens at a throughput (tokens/s across the whole slice)."""
    if tokens_per_second <= 0:
        raise SpecError(f"tokens per second must be positive, not {tokens_per_second}")
    return usd_per_hour / (tokens_per_second * 3600.0) * 1_000_000.0
