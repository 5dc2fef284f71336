"""What ``status``, ``logs``, ``cancel`` and ``local preempt`` share: finding a launched run by its id."""

from __future__ import annotations

from typing import Any

from tpu_ops.errors import SpecError


def find(settings: Any, run_id: str) -> Any:
    """The launch record of ``run_id``: this state directory's, else (with a Prefect API configured) the
    newest flow run of a tpu-ops deployment working on it; a one-line ``SpecError`` naming both places
    it looked if neither has it."""
    from flows.commands import _ui_runs
    from tpu_ops.layout import check_run_id
    from tpu_ops.train import launches

    record = launches.load(settings, check_run_id(run_id))
    if record is not None:
        return record
    url, also = _ui_runs.api_url(), ""
    if url:
        try:
            found = _ui_runs.lookup(run_id)
        except _ui_runs.Unreachable as exc:
            also = f", and the Prefect API at {url} did not answer ({exc})"
        else:
            if found is not None:
                return found
            also = f" nor among the flow runs of the tpu-ops deployments at {url}"
    raise SpecError(
        f"no run {run_id} launched with state directory {settings.state_dir}{also} "
        "(`tpu-ops status` lists the runs; TPU_OPS_STATE_DIR picks another directory)",
        [{"field": "run_id", "message": "not launched here", "value": run_id}],
    )


def spec_doc(settings: Any, record: Any) -> Any:
    """The run's spec as launched: ``spec.json`` beside its launch record, else its flow run's ``spec``."""
    import json

    from tpu_ops.train.launches import launch_dir

    path = launch_dir(settings, record.run_id) / "spec.json"
    if path.exists() or not record.flow_run_id:
        return json.loads(path.read_text(encoding="utf-8"))
    from flows.commands._ui_runs import spec_of

    return spec_of(record.flow_run_id)


def gcs(settings: Any) -> Any:
    """A storage client for reading run state."""
    from tpu_ops.cloud.clients import Clients

    return Clients(settings).gcs()


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
    from flows.commands._ui_runs import end_of

    return end_of(state)
