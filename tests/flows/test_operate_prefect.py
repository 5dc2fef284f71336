"""``launch`` through Prefect: with ``PREFECT_API_URL`` set, the run is a flow run of the served ``train``
deployment (`tpu-ops serve` on the local stack); ``status`` follows it from its run state and ``cancel``
cancels the flow run and leaves nothing behind. A run started in the UI (a flow run created from the
deployment, no ``launch``) is listed, detailed, tailed and cancelled by its run id the same way, a
pipeline's generated run id included. One ``tpu-ops serve`` for the module."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from infra.local._proc import http_call, kill_group, wait_until

ROOT = Path(__file__).resolve().parents[2]
EXE = Path(sys.executable).with_name("tpu-ops")
EXAMPLE = ROOT / "examples" / "local-train.yaml"
RUN = "ops-prefect"
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def _cli(env: dict[str, str], cwd: Path) -> Callable[..., subprocess.CompletedProcess[str]]:
    def tpu_ops(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(EXE), *argv], capture_output=True, text=True, cwd=cwd, env=env, timeout=180)

    return tpu_ops


def _status(tpu_ops: Callable[..., subprocess.CompletedProcess[str]], run_id: str) -> dict[str, Any]:
    out = tpu_ops("status", run_id, "--json")
    assert out.returncode == 0, out.stderr
    doc: dict[str, Any] = json.loads(out.stdout)
    return doc


@pytest.fixture(scope="module")
def serving(prefect_server: dict[str, str], local_stack: Any, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[dict[str, str]]:  # fmt: skip
    """`tpu-ops serve` (every deployment) against the session's Prefect server and local stack (each test resets
    the stack: ``stack``); the shell's environment, its state directory shared with the served flows."""
    state = tmp_path_factory.mktemp("operate-prefect") / "state"
    env = {**prefect_server, **local_stack.env(), "TPU_OPS_STATE_DIR": str(state),
           "PREFECT_RUNNER_POLL_FREQUENCY": "2", "PYTHONPATH": str(ROOT)}  # fmt: skip
    serve = subprocess.Popen([sys.executable, "-m", "flows.cli", "serve"], cwd=ROOT, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    out: list[bytes] = []
    threading.Thread(target=lambda: out.extend(serve.stdout), daemon=True).start()  # type: ignore[arg-type]
    try:
        wait_until(lambda: any(b"serving " in x for x in out) or serve.poll() is not None, 120, 0.2, "tpu-ops serve")
        assert serve.poll() is None, b"".join(out).decode()[-3000:]
        yield env
    finally:
        kill_group(serve, grace=20)


def test_launch_through_a_served_deployment_then_cancel(serving: dict[str, str], stack: Any, tmp_path: Path) -> None:
    """Launched, watched and cancelled from a shell with its own state directory (another machine than the one
    serving the deployments): the run's cost ledger is the worker's, its cost shown all the same."""
    from infra.local.wheelhouse import upload_wheelhouse
    from tpu_ops.cloud.clients import storage_client

    worker = stack.settings(state_dir=Path(serving["TPU_OPS_STATE_DIR"]))  # where the supervisor runs
    settings = stack.settings(state_dir=tmp_path / "shell")
    storage_client(settings).create_bucket("dryrun-tpu-checkpoints")
    upload_wheelhouse(settings, "gs://dryrun-tpu-checkpoints/wheelhouse")
    tpu_ops = _cli({**serving, "TPU_OPS_STATE_DIR": str(tmp_path / "shell")}, tmp_path)

    launched = tpu_ops("launch", str(EXAMPLE), "--run-id", RUN, "--detach")
    assert launched.returncode == 0, launched.stderr
    first = launched.stdout.splitlines()[0]
    assert first.startswith(f"launched train job {RUN} in flow run ") and first.endswith("of deployment train/default")
    flow_run = first.split(" in flow run ")[1].split()[0]
    ui = serving["PREFECT_API_URL"].removesuffix("/api")
    assert f"  UI:      {ui}/runs/flow-run/{flow_run}" in launched.stdout
    assert f"tpu-ops status {RUN}" in launched.stdout and f"tpu-ops cancel {RUN}" in launched.stdout
    run = json.loads(http_call(f"{serving['PREFECT_API_URL']}/flow_runs/{flow_run}"))
    assert run["parameters"]["run_id"] == RUN and f"tpu-ops-run:{RUN}" in run["tags"]
    listed = tpu_ops("status")
    assert [ln.split()[0] for ln in listed.stdout.splitlines()].count(RUN) == 1, listed.stdout  # not twice
    # seen from the worker's state directory (no launch record there): found through Prefect, still `launch`
    elsewhere = _cli(serving, tmp_path)("status").stdout
    assert next((ln.split() for ln in elsewhere.splitlines() if ln.startswith(f"{RUN} ")), [])[2:3] == ["launch"]

    def status() -> dict[str, Any]:
        return _status(tpu_ops, RUN)

    wait_until(lambda: (s := status())["state"] == "running" and s["hosts_alive"] == 2, 240, 1.0,
               what="the served flow run to train")  # fmt: skip
    assert status()["flow_run_id"] == flow_run and status()["mode"] == "prefect"
    _same_cost_as_the_worker(settings, worker)
    shown = tpu_ops("status", RUN).stdout
    assert "cost so far $" in shown and " (1 slice(s) billing) (as of " in shown, shown

    cancelled = tpu_ops("cancel", RUN)
    assert cancelled.returncode == 0, cancelled.stderr
    assert cancelled.stdout.startswith(f"run {RUN} cancelled (was running")
    assert "supervisor cancelled by Prefect" in cancelled.stdout
    state = json.loads(http_call(f"{serving['PREFECT_API_URL']}/flow_runs/{flow_run}"))["state"]["type"]
    assert state == "CANCELLED", state
    left = stack.state()
    assert left["nodes"] == 0 and left["queued_resources"] == 0 and not left["worker_pids"], left
    assert status()["state"] == "cancelled"
    from tpu_ops.train import launches

    saved = launches.load(settings, RUN)  # what status falls back on once neither Prefect nor GCS answers
    assert saved is not None and saved.outcome == "cancelled"
    # torn down: the figure is exact and the same here, on the worker and in cancel's audit record
    from flows.audit import trail_for
    from tpu_ops.export.release import chain_records
    from tpu_ops.provision.ledger import Ledger
    from tpu_ops.provision.prices import load as load_prices

    final = Ledger(worker, RUN).summary(load_prices(worker))
    assert final.open_slices == 0 and final.usd_total > 0
    (audited,) = [r for r in chain_records(trail_for(settings), RUN) if r["event"] == "run.cancelled"]
    assert audited["params"]["cost_usd"] == round(final.usd_total, 4), audited["params"]
    assert status()["cost_usd"] == round(final.usd_total, 4) and status()["cost_as_of"] is None


def _same_cost_as_the_worker(shell: Any, worker: Any) -> None:
    """At one moment, the shell's status of the running run shows the cost the worker's own ledger gives (once the
    supervisor's first state save after the slice came up published it)."""
    import time

    from tpu_ops.cloud.clients import storage_client
    from tpu_ops.provision.ledger import Ledger
    from tpu_ops.provision.prices import load as load_prices
    from tpu_ops.train import launches
    from tpu_ops.train.status import run_status

    record, gcs = launches.load(shell, RUN), storage_client(shell)
    wait_until(lambda: run_status(shell, record, gcs).cost_known, 30, 0.5, "the run's cost published")
    now = time.time()
    there = run_status(shell, record, gcs, now=now)
    assert there.cost_usd == round(Ledger(worker, RUN).summary(load_prices(worker), now).usd_total, 4) > 0
    assert there.open_slices == 1 and there.cost_as_of is not None and now - there.cost_as_of < 30


def _from_the_ui(api: str, deployment: str, params: dict[str, Any]) -> str:
    """A flow run of ``deployment`` created as the UI's form creates it (no tag, no launch record); its id."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: api}), get_client(sync_client=True) as client:
        dep = client.read_deployment_by_name(deployment)
        return str(client.create_flow_run_from_deployment(dep.id, parameters=params).id)


def _nothing_left(stack: Any) -> None:
    left = stack.state()
    assert left["nodes"] == 0 and left["queued_resources"] == 0 and not left["worker_pids"], left


def test_runs_started_in_the_ui_are_listed_tailed_and_cancelled_by_run_id(
    serving: dict[str, str], stack: Any, tmp_path: Path, pipeline_on_stack: Any
) -> None:
    from infra.local.wheelhouse import upload_wheelhouse
    from tpu_ops.cloud.clients import storage_client
    from tpu_ops.polling import poll
    from tpu_ops.specs import TrainJobSpec, load_spec
    from tpu_ops.train import launches

    api, state = serving["PREFECT_API_URL"], Path(serving["TPU_OPS_STATE_DIR"])
    settings = stack.settings(state_dir=state)
    storage_client(settings).create_bucket("dryrun-tpu-checkpoints")
    upload_wheelhouse(settings, "gs://dryrun-tpu-checkpoints/wheelhouse")
    tpu_ops = _cli(serving, tmp_path)
    spec = load_spec(EXAMPLE, TrainJobSpec).model_dump(mode="json")  # what the form sends
    flow_run = _from_the_ui(api, "train/default", {"spec": spec, "run_id": "ops-ui"})

    wait_until(lambda: (s := _status(tpu_ops, "ops-ui"))["state"] == "running" and s["hosts_alive"] == 2, 240, 1.0,
               what="the UI's flow run to train")  # fmt: skip
    assert launches.load(settings, "ops-ui") is None  # nothing here: found through the Prefect API
    missing = tpu_ops("logs", "never-ran")
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1, missing.stderr
    assert f"state directory {state} nor among the flow runs of the tpu-ops deployments at {api} " in missing.stderr
    row = next(ln.split() for ln in tpu_ops("status").stdout.splitlines() if ln.startswith("ops-ui "))
    assert row[1:4] == ["train-job", "ui", "running"] and row[6] == "2/2", row
    detail = tpu_ops("status", "ops-ui").stdout
    assert detail.startswith("run ops-ui (train-job, started from the Prefect UI or API "), detail
    assert "running at step " in detail
    assert f"  UI: {api.removesuffix('/api')}/runs/flow-run/{flow_run}" in detail
    seen: list[str] = []

    def trainers() -> str | None:
        out = tpu_ops("logs", "ops-ui")
        seen[:] = [out.stdout + out.stderr]
        return out.stdout if "[w0] worker 0: committed step 10" in out.stdout else None

    try:
        logs = poll(trainers, timeout_s=120, interval_s=1.0, max_interval_s=1.0, what="the trainers' lines")
    except TimeoutError:
        raise AssertionError(seen[0][-2000:]) from None
    assert "[w0] worker 0: fresh start" in logs and "[w1] worker 1: fresh start" in logs

    preempt = tpu_ops("local", "preempt", "ops-ui", "--slice", "1")  # its spec read from the flow run
    assert preempt.stderr == "error: --slice 1 is not allowed: run ops-ui has slices 0-0\n", preempt.stderr
    cancelled = tpu_ops("cancel", "ops-ui")
    assert cancelled.returncode == 0, cancelled.stderr
    assert cancelled.stdout.startswith("run ops-ui cancelled (was running")
    assert "supervisor cancelled by Prefect" in cancelled.stdout
    assert json.loads(http_call(f"{api}/flow_runs/{flow_run}"))["state"]["type"] == "CANCELLED"
    _nothing_left(stack)
    assert _status(tpu_ops, "ops-ui")["state"] == "cancelled"

    # A pipeline started without a run id (as its schedule starts it): found by the id it generated.
    def longer(doc: dict[str, Any]) -> None:
        doc["run_id"] = None
        doc["train"]["steps"] = 3000

    _, pipeline = pipeline_on_stack.seed("dryrun.yaml", "unused", "ui-nightly", longer)
    assert pipeline.run_id is None
    flow_run = _from_the_ui(api, "retraining-pipeline/default", {"spec": pipeline.model_dump(mode="json")})

    def generated() -> str | None:
        rows = [ln.split() for ln in tpu_ops("status").stdout.splitlines()]
        return next((r[0] for r in rows if r[0].startswith("ui-nightly-") and r[1] == "pipeline"), None)

    run_id = poll(generated, timeout_s=120, interval_s=1.0, max_interval_s=1.0, what="the pipeline's run id")
    assert f"tpu-ops-run:{run_id}" in json.loads(http_call(f"{api}/flow_runs/{flow_run}"))["tags"]
    assert tpu_ops("status", run_id).stdout.startswith(f"run {run_id} (pipeline, started from the Prefect UI or API ")
    cancelled = tpu_ops("cancel", run_id)
    assert cancelled.returncode == 0 and cancelled.stdout.startswith(f"run {run_id} cancelled"), cancelled
    assert "supervisor cancelled by Prefect" in cancelled.stdout
    assert json.loads(http_call(f"{api}/flow_runs/{flow_run}"))["state"]["type"] == "CANCELLED"
    _nothing_left(stack)
    assert _status(tpu_ops, run_id)["state"] == "cancelled"
