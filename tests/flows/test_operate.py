"""An operator's day on the local stack: launch a train spec, watch it, read its logs, preempt it, cancel it.

One walk through the commands as a person types them (each a ``tpu-ops`` process, the run a detached
process of its own), against the session's emulated clouds; then each command's bad input.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.local._proc import wait_until
from infra.local.wheelhouse import upload_wheelhouse

EXE = Path(sys.executable).with_name("tpu-ops")
RUN = "ops-walk"
BUCKET = "dryrun-tpu-checkpoints"  # where `tpu-ops local seed` puts the wheelhouse the example fetches
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "local-train.yaml"


def _spec(tmp_path: Path, steps: int | None = None) -> Path:
    """The walk's spec (docs/operating.md): a 2-host v4-16 spot slice, the reference trainer, 3,000 steps."""
    if steps is None:
        return EXAMPLE
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["train"]["steps"] = steps
    path = tmp_path / "walk.yaml"
    path.write_text("# kind: train-job\n" + yaml.safe_dump(doc, sort_keys=False))
    return path


def _env(stack: Any, tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TPU_OPS_", "AWS_", "PREFECT_API"))}
    return {**env, **stack.env(), "TPU_OPS_STATE_DIR": str(tmp_path / "state"), "PREFECT_HOME": str(tmp_path / "ph")}


def _cli(env: dict[str, str], cwd: Path) -> Callable[..., subprocess.CompletedProcess[str]]:
    def tpu_ops(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(EXE), *argv], capture_output=True, text=True, cwd=cwd, env=env, timeout=180)

    return tpu_ops


def _status(tpu_ops: Callable[..., subprocess.CompletedProcess[str]]) -> dict[str, Any]:
    out = tpu_ops("status", RUN, "--json")
    assert out.returncode == 0, out.stderr
    doc: dict[str, Any] = json.loads(out.stdout)
    return doc


@pytest.fixture
def no_stray_supervisor(stack: Any, tmp_path: Path) -> Iterator[None]:
    """If the walk fails half-way, its detached supervisor is stopped and its slice deleted all the same."""
    yield
    from tpu_ops.provision import teardown
    from tpu_ops.train import launches

    settings = stack.settings(state_dir=tmp_path / "state")
    record = launches.load(settings, RUN)
    if record is not None and record.pid and record.supervisor_alive():
        with contextlib.suppress(ProcessLookupError):
            os.killpg(record.pid, signal.SIGKILL)
        teardown(RUN, settings, zones=record.zones)


@pytest.mark.slow
@pytest.mark.usefixtures("no_stray_supervisor")
def test_launch_status_logs_preempt_status_cancel_and_nothing_left(stack: Any, tmp_path: Path) -> None:
    from tpu_ops.cloud.clients import storage_client
    from tpu_ops.train import launches
    from tpu_ops.train.status import run_status

    settings = stack.settings(state_dir=tmp_path / "state")
    gcs = storage_client(settings)
    gcs.create_bucket(BUCKET)
    upload_wheelhouse(settings, f"gs://{BUCKET}/wheelhouse")
    tpu_ops = _cli(_env(stack, tmp_path), tmp_path)

    launched = tpu_ops("launch", str(_spec(tmp_path)), "--run-id", RUN, "--detach")
    assert launched.returncode == 0, launched.stderr
    assert f"launched train job {RUN} in a background process" in launched.stdout
    for follow_up in (f"tpu-ops status {RUN}", f"tpu-ops logs {RUN} --follow", f"tpu-ops cancel {RUN}"):
        assert follow_up in launched.stdout
    record = launches.load(settings, RUN)
    assert record is not None and record.supervisor_alive()

    def now() -> Any:
        return run_status(settings, launches.load(settings, RUN) or record, gcs)

    # running on its slice, both hosts heart-beating, past a committed checkpoint
    wait_until(lambda: (s := now()).state == "running" and s.hosts_alive == 2 and (s.step or 0) > 12, 90,
               what="the run to train on both hosts")  # fmt: skip
    shown = tpu_ops("status", RUN)
    assert shown.returncode == 0, shown.stderr
    assert f"run {RUN} (train-job" in shown.stdout and ": running at step " in shown.stdout
    assert "spot in us-central2-b, 2/2 hosts alive" in shown.stdout and "cost so far $" in shown.stdout
    doc = _status(tpu_ops)
    (sl,) = doc["slices"]
    assert sl["slice_id"].startswith(RUN) and sl["tier"] == "spot" and sl["hosts_alive"] == 2
    assert doc["cost_usd"] > 0 and doc["open_slices"] == 1 and 0 < doc["goodput"] < 1
    # the reference trainer reports tokens and model FLOPs per step: $ per million tokens and MFU so far
    assert doc["tokens"] > 0 and doc["mfu"] > 0 and doc["usd_per_million_tokens"] > 0, doc
    # a served reaper, which finds no Prefect flow run of it, leaves the launched run's slice alone
    from tpu_ops.provision.reaper import reap

    judged = reap(settings, run_state=lambda run_id: None, dry_run=True, zones=["us-central2-b"])
    assert not [r for r in judged.reaped if r.run_id == RUN], judged
    table = tpu_ops("status")
    assert table.stdout.splitlines()[0].split()[:4] == ["RUN", "KIND", "FROM", "STATE"]
    assert next(ln.split() for ln in table.stdout.splitlines() if ln.startswith(f"{RUN} "))[2] == "launch"

    # every worker's trainer output, labelled
    logs = tpu_ops("logs", RUN)
    assert logs.returncode == 0, logs.stderr
    assert "[w0] worker 0: fresh start" in logs.stdout and "[w1] worker 1: fresh start" in logs.stdout
    assert "[w0] worker 0: committed step 10" in logs.stdout
    only1 = tpu_ops("logs", RUN, "--worker", "1").stdout
    assert "[w1] " in only1 and "[w0] " not in only1

    # a spot preemption, and the recovery
    before = now()
    preempted = tpu_ops("local", "preempt", RUN)
    assert preempted.returncode == 0, preempted.stderr
    assert preempted.stdout.startswith(f"preempted node {before.slices[0].slice_id} in us-central2-b")
    hint = preempted.stdout.split("watch the recovery: ")[1].split()  # a program this shell runs, venv or not
    assert os.access(hint[0], os.X_OK) and hint[1:] == ["status", RUN], preempted.stdout
    wait_until(lambda: (s := now()).recoveries == 1 and s.state == "running" and s.hosts_alive == 2, 90,
               what="the run to recover on a new slice")  # fmt: skip
    recovered = tpu_ops("status", RUN)
    assert "preemptions 1, recovered 1" in recovered.stdout and ": running at step " in recovered.stdout
    logs = tpu_ops("logs", RUN).stdout
    assert "-- slice incarnation 1 --" in logs and "[w0] worker 0: restored step " in logs
    assert "[w1] worker 1: restored step " in logs

    # cancel: the supervisor stops by itself, tears down, and the cancellation is audited
    cancelled = tpu_ops("cancel", RUN)
    assert cancelled.returncode == 0, cancelled.stderr
    assert cancelled.stdout.startswith(f"run {RUN} cancelled (was running, at step ")
    assert "supervisor stopped by itself" in cancelled.stdout and "confirmed gone" in cancelled.stdout
    final = _status(tpu_ops)
    assert final["state"] == "cancelled" and final["open_slices"] == 0 and final["slices"] == []
    ended = launches.load(settings, RUN)
    assert ended is not None and ended.outcome == "cancelled" and ended.supervisor_alive() is False
    left = stack.state()
    assert left["nodes"] == 0 and left["queued_resources"] == 0 and not left["worker_pids"], left
    assert not [k for k, v in left["compute"].items() if isinstance(v, int) and v], left["compute"]
    trail = _trail_events(settings, RUN)
    assert "run.cancelled" in trail and "slice.preempted" in trail and "slice.recovered" in trail

    # cancelling it again: it already ended, so nothing changes (no second run.cancelled record)
    again = tpu_ops("cancel", RUN)
    assert again.returncode == 0, again.stderr
    assert again.stdout.startswith(f"run {RUN} already ended (cancelled at step "), again.stdout
    assert "nothing to cancel" in again.stdout and "nothing left to delete" in again.stdout
    assert _trail_events(settings, RUN).count("run.cancelled") == 1
    assert launches.load(settings, RUN).cancelled_by == ended.cancelled_by


def _trail_events(settings: Any, run_id: str) -> list[str]:
    from flows.audit import trail_for
    from tpu_ops.export.release import chain_records

    return [r["event"] for r in chain_records(trail_for(settings), run_id)]


@pytest.mark.slow
def test_the_train_forms_inject_preemption_shows_a_recovery(
    stack: Any, tmp_path: Path, prefect_api: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The UI path: the `train` flow (what its form runs) with inject_preemption on recovers once."""
    from flows.train import train
    from tpu_ops.cloud.clients import storage_client

    for key, value in {**stack.env(), "TPU_OPS_STATE_DIR": str(tmp_path / "state")}.items():
        monkeypatch.setenv(key, value)
    settings = stack.settings(state_dir=tmp_path / "state")
    storage_client(settings).create_bucket(BUCKET)
    upload_wheelhouse(settings, f"gs://{BUCKET}/wheelhouse")
    doc = yaml.safe_load(_spec(tmp_path, steps=40).read_text())
    report = train(spec=doc, run_id="form-walk", inject_preemption=True)
    assert report["outcome"] == "done" and report["final_step"] == 40 and report["recoveries"] == 1
    (p,) = report["preemptions"]
    assert p["resume_step"] is not None and p["resume_step"] >= 10
    left = stack.state()
    assert left["nodes"] == 0 and left["queued_resources"] == 0 and not left["worker_pids"], left


def test_inject_preemption_is_refused_outside_the_local_stack(tmp_path: Path) -> None:
    from flows.chaos import injected_preemption
    from tpu_ops.errors import ConfigError
    from tpu_ops.layout import RunLayout
    from tpu_ops.settings import Settings
    from tpu_ops.specs import ProvisionSpec

    spec = ProvisionSpec.model_validate(yaml.safe_load(_spec(tmp_path).read_text())["provision"])
    layout = RunLayout.of("gs://walk-ckpt/runs", "real-run")
    with pytest.raises(ConfigError, match="local stack only"), injected_preemption(
        True, Settings(dry_run=False), spec, layout, "real-run", print
    ):
        pass  # never reached


@pytest.mark.slow
@pytest.mark.usefixtures("no_stray_supervisor")
def test_a_launched_provision_spec_hands_off_its_slice_until_cancel(stack: Any, tmp_path: Path) -> None:
    spec = tmp_path / "slice.yaml"
    doc = {"slice": {"accelerator_type": "v4-8", "region": "us-central2", "zones": ["us-central2-b"]},
           "ladder": ["spot"], "budget_usd": 10, "hours": 1, "queue_timeout": "30s", "overall_timeout": "60s"}
    spec.write_text("# kind: provision\n" + yaml.safe_dump(doc))
    tpu_ops = _cli(_env(stack, tmp_path), tmp_path)
    launched = tpu_ops("launch", str(spec), "--run-id", RUN)  # in the foreground: until the slice is up
    assert launched.returncode == 0, launched.stderr
    assert f"launched slice {RUN} in a background process" in launched.stdout and "tpu-ops logs" not in launched.stdout
    assert f"run {RUN}: up; cost $" in launched.stdout
    up = _status(tpu_ops)
    assert up["state"] == "up" and up["open_slices"] == 1 and up["slices"][0]["zone"] == "us-central2-b"
    assert stack.state()["nodes"] == 1  # the process that provisioned it has exited: the slice stays
    cancelled = tpu_ops("cancel", RUN)
    assert cancelled.returncode == 0, cancelled.stderr
    assert "supervisor had already exited; torn down: queued-resource " in cancelled.stdout
    assert _status(tpu_ops)["state"] == "cancelled"
    left = stack.state()
    assert left["nodes"] == 0 and left["queued_resources"] == 0, left
