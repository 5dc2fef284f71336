"""The budget first: a run whose estimate exceeds its budget is refused before its first cloud call.

Flows that will spend (the pipeline, whose mirror step already pays S3 egress; the train flow)
call :func:`refusal` before they open the run, so an over-budget spec costs nothing and fails on
one line with the figures and the fix, not with a traceback at step None.
"""

from __future__ import annotations

from tpu_ops.errors import BudgetError
from tpu_ops.specs.slice import ProvisionSpec


def refusal(provision: ProvisionSpec, field: str = "provision.budget_usd") -> str | None:
    """The one-line refusal of a run over budget (``None`` when the estimate fits).

    ``field`` is where the budget sits in the spec the user wrote, so the fix names it. Reads the
    price table only (the settings' table, else the shipped one): no cloud call.
    """
    from tpu_ops.provision.cost import budget_line, check_budget
    from tpu_ops.provision.prices import load
    from tpu_ops.settings import Settings

    try:
        check_budget(provision, load(Settings()), field)
    except BudgetError as exc:
        return budget_line(exc)
    return None
