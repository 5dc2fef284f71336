"""``launch`` through Prefect: with ``PREFECT_API_URL`` set, the run is a flow run of the served ``train``
deployment (`tpu-ops serve` on the local stack); ``status`` follows it from its run state and ``cancel``
cancels the flow run and leaves nothing behind."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from infra.local._proc import http_call, kill_group, wait_until

ROOT = Path(__file__).resolve().parents[2]
EXE = Path(sys.executable).with_name("tpu-ops")
EXAMPLE = ROOT / "examples" / "local-train.yaml"
RUN = "ops-prefect"
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture
def serving(prefect_server: dict[str, str], stack: Any, tmp_path: Path) -> Iterator[dict[str, str]]:
    """`tpu-ops serve` (every deployment) against the session's Prefect server and the (reset) local stack."""
    env = {**prefect_server, **stack.env(), "TPU_OPS_STATE_DIR": str(tmp_path / "state"),
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
    from infra.local.wheelhouse import upload_wheelhouse
    from tpu_ops.cloud.clients import storage_client

    settings = stack.settings(state_dir=tmp_path / "state")
    storage_client(settings).create_bucket("dryrun-tpu-checkpoints")
    upload_wheelhouse(settings, "gs://dryrun-tpu-checkpoints/wheelhouse")

    def tpu_ops(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(EXE), *argv], capture_output=True, text=True, cwd=tmp_path, env=serving,
                              timeout=180)  # fmt: skip

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

    def status() -> dict[str, Any]:
        out = tpu_ops("status", RUN, "--json")
        assert out.returncode == 0, out.stderr
        doc: dict[str, Any] = json.loads(out.stdout)
        return doc

    wait_until(lambda: (s := status())["state"] == "running" and s["hosts_alive"] == 2, 240, 1.0,
               what="the served flow run to train")  # fmt: skip
    assert status()["flow_run_id"] == flow_run and status()["mode"] == "prefect"

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
