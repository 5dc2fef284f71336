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


FINAL = {"COMPLETED": "done", "FAILED": "failed", "CRASHED": "failed", "CANCELLED": "cancelled"}


def flow_run_end(record: Any) -> tuple[str, str] | None:
    """How the run's Prefect flow run ended (state, its message), None while it goes on or if it has none.

    No Prefect API configured here, or unreachable: None (the run state in GCS still says what it can)."""
    if not record.flow_run_id:
        return None
    from uuid import UUID

    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL

    if not PREFECT_API_URL.value():
        return None  # no API configured here: never a temporary server just to ask
    try:
        with get_client(sync_client=True) as client:
            state = client.read_flow_run(UUID(record.flow_run_id)).state
    except Exception:  # an outage or a deleted flow run must not hide what GCS says
        return None
    if state is None or not state.is_final():
        return None
    return FINAL.get(state.type.value, "failed"), str(state.message or "")
