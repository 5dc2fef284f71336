"""The end of a run: its state closed and its goodput report (cost from the ledger) written to GCS."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

from tpu_ops.accelerators import AcceleratorType
from tpu_ops.errors import TpuOpsError
from tpu_ops.layout import RunLayout
from tpu_ops.provision.ledger import Ledger
from tpu_ops.provision.prices import load as load_prices
from tpu_ops.settings import Settings
from tpu_ops.train import cancel
from tpu_ops.train.checkpoints import latest_complete_step
from tpu_ops.train.efficiency import efficiency
from tpu_ops.train.goodput import GoodputReport
from tpu_ops.train.layout import put_json
from tpu_ops.train.runstate import RunState


def finish(
    state: RunState,
    report: GoodputReport,
    gcs: Any,
    layout: RunLayout,
    ledger: Ledger,
    settings: Settings,
    accelerator: AcceleratorType | str,
    save: Callable[[], None],
    slices: int = 1,
) -> GoodputReport:
    """The report (derived from the run's state, cost from the ledger) to GCS; best effort, never masks an error."""
    if state.final_step is None:
        with contextlib.suppress(TpuOpsError):
            state.final_step = latest_complete_step(gcs, layout.steps_uri)
    live, ended = state.live, state.outcome in ("failed", cancel.CANCELLED)
    if live is not None and ended:
        live.end, live.ended_at = state.outcome, time.time()
        live.kept_until = state.final_step
    if ended and state.finished_at is None:
        state.finished_at = time.time()
    try:
        cost = ledger.summary(load_prices(settings)).to_json()
        report = GoodputReport.derive(state, time.time(), cost)
        report.efficiency = efficiency(state, cost, accelerator, slices=slices).to_json()
        put_json(gcs, layout.goodput, report.to_json())
        if state.outcome == "failed":
            state.finished_at = None  # a later supervisor resumes the run: its wall goes on
        save()
    except (TpuOpsError, OSError) as exc:
        report.error = report.error or f"goodput report not written: {exc}"
    return report
