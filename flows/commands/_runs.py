"""What ``status``, ``logs``, ``cancel`` and ``local preempt`` share: finding a launched run by its id."""

from __future__ import annotations

from typing import Any

from tpu_ops.errors import SpecError


def find(settings: Any, run_id: str) -> Any:
    """The launch record of ``run_id``; a one-line ``SpecError`` naming where it looked if there is none."""
    from tpu_ops.layout import check_run_id
    from tpu_ops.train import launches

    record = launches.load(settings, check_run_id(run_id))
    if record is None:
        raise SpecError(
            f"no run {run_id} launched with state directory {settings.state_dir} "
            "(`tpu-ops status` lists the runs; TPU_OPS_STATE_DIR picks another directory)",
            [{"field": "run_id", "message": "not launched here", "value": run_id}],
        )
    return record


def gcs(settings: Any) -> Any:
    """A storage client for reading run state."""
    from tpu_ops.cloud.clients import Clients

    return Clients(settings).gcs()
