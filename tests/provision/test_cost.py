"""Price table, budget and the what-if arithmetic of ``tpu-ops cost`` (no cloud needed)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tpu_ops.errors import BudgetError, ConfigError, SpecError
from tpu_ops.provision import cost as C
from tpu_ops.provision.prices import load, shipped
from tpu_ops.settings import Settings


def test_shipped_table_has_date_source_and_every_generation() -> None:
    t = shipped()
    assert t.date == "2026-11-21" and "cloud.google.com/tpu/pricing" in t.source
    for gen in ("v4", "v5e", "v5p", "v6e"):
        for tier in ("on-demand", "spot", "reservation", "commit-1y", "commit-3y"):
            assert t.price(gen, tier) > 0
        assert t.price(gen, "spot") < t.price(gen, "on-demand")
        assert t.price(gen, "commit-3y") < t.price(gen, "commit-1y") < t.price(gen, "on-demand")


def test_price_table_override_from_settings(tmp_path: Path) -> None:
    path = tmp_path / "prices.json"
    path.write_text(
        json.dumps({"date": "2027-01-01", "source": "our contract", "generations": {"v5p": {"on-demand": 8}}})
    )
    t = load(Settings(price_table=path))
    assert (t.date, t.source, t.price("v5p", "on-demand")) == ("2027-01-01", "our contract", 8.0)
    with pytest.raises(ConfigError, match="no price for v5p spot"):
        t.price("v5p", "spot")


@pytest.mark.parametrize(
    "body, message",
    [
        ({"source": "x", "generations": {}}, "missing date"),
        ({"date": "d", "source": "x", "generations": {"v9": {}}}, "unknown generation"),
        ({"date": "d", "source": "x", "generations": {"v4": {"gold": 1}}}, "unknown tier"),
        ({"date": "d", "source": "x", "generations": {"v4": {"spot": -1}}}, "not a price"),
    ],
)
def test_bad_price_tables_are_refused(tmp_path: Path, body: dict[str, Any], message: str) -> None:
    path = tmp_path / "p.json"
    path.write_text(json.dumps(body))
    with pytest.raises(ConfigError, match=message):
        load(path=path)


def test_v5p_arithmetic_at_8_dollars_per_chip_hour() -> None:
    # The figure: 128 chips x $8 = $1,024/hour exactly.
    assert C.hourly_usd(128, 8.0) == 1024.0
    # v5p-128 is 64 chips (128 TensorCores): at $8/chip-hour that is $512/hour.
    from tpu_ops.accelerators import lookup

    assert lookup("v5p-128").chips == 64
    assert C.hourly_usd(lookup("v5p-128").chips, 8.0) == 512.0


def test_compare_tiers_and_commitments() -> None:
    t = shipped()
    rows = C.compare_tiers(64, 10, "v5p", t)
    assert rows["on-demand"]["usd"] == pytest.approx(64 * 10 * t.price("v5p", "on-demand"))
    assert rows["spot"]["usd"] < rows["on-demand"]["usd"]
    q = C.commitment_savings(64, "v5p", 1.0, 1, t)
    assert q.on_demand_usd == pytest.approx(64 * 8760 * t.price("v5p", "on-demand"))
    assert q.savings_usd == pytest.approx(64 * 8760 * (t.price("v5p", "on-demand") - t.price("v5p", "commit-1y")))
    assert q.break_even_utilisation == pytest.approx(t.price("v5p", "commit-1y") / t.price("v5p", "on-demand"))
    # Below break-even utilisation the commitment loses money.
    low = C.commitment_savings(64, "v5p", q.break_even_utilisation / 2, 1, t)
    assert low.savings_usd < 0
    with pytest.raises(SpecError):
        C.commitment_savings(64, "v5p", 0.5, 2, t)
    with pytest.raises(SpecError):
        C.commitment_savings(64, "v5p", 1.5, 1, t)


def test_cost_per_million_tokens() -> None:
    # $1,024/h at 100k tokens/s = 360M tokens/h -> $2.8444 per million.
    assert C.usd_per_million_tokens(1024.0, 100_000) == pytest.approx(1024 / 360)
    with pytest.raises(SpecError):
        C.usd_per_million_tokens(1.0, 0)


def test_budget_estimate_uses_the_most_expensive_rung(spec_factory: Any) -> None:
    t = shipped()
    spec = spec_factory(budget_usd=200, hours=2)  # v4-32: 16 chips
    est = C.estimate(spec, t)
    assert [r.tier for r in est.rungs] == ["reservation", "spot", "on-demand"]
    assert est.worst_usd == pytest.approx(16 * 2 * t.price("v4", "on-demand"))
    assert C.check_budget(spec, t) == est
    with pytest.raises(BudgetError) as info:
        C.check_budget(spec_factory(budget_usd=50, hours=2), t)
    assert info.value.budget_usd == 50 and info.value.estimate_usd == pytest.approx(103.04)
    assert "$103.04" in str(info.value) and "$50.00" in str(info.value)
    # Spot alone fits where on-demand would not.
    assert C.check_budget(spec_factory(budget_usd=50, hours=2, ladder=["spot"]), t).worst_usd < 50


def test_budget_covers_the_dearest_rung_wherever_it_stands(spec_factory: Any) -> None:
    """Cheap rung first, dear rung last: the budget must still cover the dear one."""
    t = shipped()
    spot, on_demand = 16 * 2 * t.price("v4", "spot"), 16 * 2 * t.price("v4", "on-demand")  # $46.40, $103.04
    spec = spec_factory(budget_usd=60, hours=2, ladder=["spot", "on-demand"])
    assert C.estimate(spec, t).worst_usd == pytest.approx(on_demand)
    with pytest.raises(BudgetError) as info:
        C.check_budget(spec, t)
    assert info.value.estimate_usd == pytest.approx(on_demand) and "on-demand rung" in str(info.value)
    assert C.check_budget(spec_factory(budget_usd=60, hours=2, ladder=["spot"]), t).worst_usd == pytest.approx(spot)
