"""``tpu_ops.train.status`` on runs that never wrote run state: what the launch record and Prefect say."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from tpu_ops.train.launches import PREFECT, PROCESS, LaunchRecord
from tpu_ops.train.status import run_status


def _record(**kw: Any) -> LaunchRecord:
    return LaunchRecord("never-wrote", "train-job", kw.pop("mode", PROCESS), checkpoint_dir="gs://no-such-ckpt/runs",
                        zones=["us-central2-b"], hosts=2, **kw)  # fmt: skip


def test_a_run_without_state_is_starting_then_lost_when_its_process_is_gone(local_stack: Any, tmp_path: Path) -> None:
    from tpu_ops.cloud.clients import storage_client

    settings = local_stack.settings(state_dir=tmp_path)
    gcs = storage_client(settings)
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert run_status(settings, _record(pid=live.pid), gcs).state == "starting"
    finally:
        live.kill()
        live.wait()
    gone = run_status(settings, _record(pid=live.pid, error="RuntimeError: boom"), gcs)
    assert gone.state == "lost" and gone.error == "RuntimeError: boom" and gone.supervisor_alive is False


def test_a_flow_run_that_ended_before_any_run_state_stands_for_the_run(local_stack: Any, tmp_path: Path) -> None:
    from tpu_ops.cloud.clients import storage_client

    settings = local_stack.settings(state_dir=tmp_path)
    record = _record(mode=PREFECT, flow_run_id="0e6f3c1e-0000-4000-8000-000000000000")
    gcs = storage_client(settings)
    assert run_status(settings, record, gcs).state == "starting"
    crashed = run_status(settings, record, gcs, flow_run=("failed", "Flow run crashed: worker lost"))
    assert crashed.state == "failed" and crashed.error == "Flow run crashed: worker lost"
    record.cancelled_at = 1.0
    assert run_status(settings, record, gcs, flow_run=("cancelled", "")).state == "cancelled"


def test_a_prefect_run_cancel_saw_stop_stays_cancelled_when_neither_prefect_nor_its_state_answers(
    local_stack: Any, tmp_path: Path
) -> None:
    """A local stack started anew has no run state and the old flow run's server is gone: 'cancelling' for ever."""
    from tpu_ops.cloud.clients import storage_client

    settings = local_stack.settings(state_dir=tmp_path)
    record = _record(mode=PREFECT, flow_run_id="0e6f3c1e-0000-4000-8000-000000000001")
    record.cancelled_at = 1.0
    gcs = storage_client(settings)
    assert run_status(settings, record, gcs).state == "cancelling"  # asked to stop, not seen stopping yet
    record.outcome = "cancelled"  # what `tpu-ops cancel` records once it saw the flow run stop
    assert run_status(settings, record, gcs).state == "cancelled"


def test_a_slice_provisioned_by_a_prefect_worker_elsewhere_has_no_cost_that_looks_real(
    local_stack: Any, tmp_path: Path
) -> None:
    """A provision run found through Prefect: no run state, no published copy, and its ledger on the worker that
    provisioned it. Nothing billed here is not $0; a ledger here that billed it is the figure."""
    from flows.commands.status import detail, table
    from tpu_ops.provision.ledger import ACTIVE, Ledger

    settings = local_stack.settings(state_dir=tmp_path)
    record = LaunchRecord("ui-slice", "provision", PREFECT, zones=["us-central2-b"], hosts=1, origin="ui")
    elsewhere = run_status(settings, record, None)
    assert not elsewhere.cost_known and "cost not known here" in detail(elsewhere)
    assert table([elsewhere]).splitlines()[1].split()[7] == "-"
    Ledger(settings, "ui-slice").append(ACTIVE, resource_id="ui-slice-a1", zone="us-central2-b", tier="spot",
                                        chips=4, generation="v4", t=1.0)  # fmt: skip
    here = run_status(settings, record, None, now=3601.0)
    assert here.cost_known and here.state == "up" and here.cost_usd > 0
    launched = LaunchRecord("local-slice", "provision", PROCESS, zones=["us-central2-b"], hosts=1)
    assert run_status(settings, launched, None).cost_known  # launched here in a process: its ledger is here
