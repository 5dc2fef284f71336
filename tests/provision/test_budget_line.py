"""The one line a person reads for an over-budget run: the figures, then the fix when there is one."""

from __future__ import annotations

from tpu_ops.errors import BudgetError
from tpu_ops.provision.cost import budget_line


def test_the_budget_line_adds_the_fix_only_when_there_is_one() -> None:
    err = BudgetError("over budget: $20.00 > $10.00", estimate_usd=20.0, budget_usd=10.0)
    assert budget_line(err) == "over budget: $20.00 > $10.00"
    err.fix = "raise budget_usd to at least $20.00"
    assert budget_line(err) == "over budget: $20.00 > $10.00 — fix: raise budget_usd to at least $20.00"
