"""Helpers for supervisor tests: small job specs, a supervisor in a thread, fault injection."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from infra.local.wheelhouse import reference_setup
from tpu_ops.cloud.tpu import TpuApi
from tpu_ops.run import Run as TpuOpsRun
from tpu_ops.settings import Settings
from tpu_ops.specs import TrainJobSpec
from tpu_ops.train.goodput import GoodputReport
from tpu_ops.train.supervisor import supervise

ZONE = "us-central2-b"


def job_spec(bucket: str, accelerator: str = "v4-8", **train: Any) -> TrainJobSpec:
    """A small, fast job: single-host v4-8 spot, short polls; ``train`` overrides TrainSpec fields."""
    hp = {"step_delay_s": 0.05, **train.pop("hyperparameters", {})}
    if "command" not in train and "setup" not in train:  # the reference trainer: numpy from the wheelhouse
        train.update(reference_setup(f"gs://{bucket}/wheelhouse"))
    body = {
        "checkpoint_dir": f"gs://{bucket}/runs", "steps": 30, "checkpoint_every": 5, "hyperparameters": hp,
        "poll_interval": 0.5, "heartbeat_interval": 0.25, "stall_limit": "30s", "term_grace": 1, **train,
    }  # fmt: skip
    return TrainJobSpec.model_validate({
        "provision": {"slice": {"accelerator_type": accelerator, "region": "us-central2", "zones": [ZONE]},
                      "ladder": ["spot", "on-demand"], "budget_usd": 1000, "hours": 1, "queue_timeout": "10s",
                      "overall_timeout": "60s"},
        "train": body,
    })  # fmt: skip


def wait_for(check: Callable[[], Any], timeout: float = 60.0, what: str = "condition", interval: float = 0.02) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


class Run:
    """``supervise`` in a background thread; ``result()`` joins it (re-raising its error)."""

    def __init__(self, job: TrainJobSpec, run_id: str, settings: Settings, **kw: Any) -> None:
        self.report: GoodputReport | None = None
        self.error: BaseException | None = None
        self.error_at: float | None = None
        self.events: list[tuple[str, dict[str, Any]]] = []

        def target() -> None:
            try:
                run = TpuOpsRun.of_job(run_id, settings, job)
                self.report = supervise(job, run, notify=lambda n, p: self.events.append((n, p)), **kw)
            except BaseException as exc:
                self.error, self.error_at = exc, time.time()

        self.thread = threading.Thread(target=target, daemon=True)
        self.thread.start()

    def result(self, timeout: float = 120.0) -> GoodputReport:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the supervisor did not finish"
        if self.error is not None:
            raise self.error
        assert self.report is not None
        assert_sound(self.report.to_json())
        return self.report


def assert_sound(doc: dict[str, Any]) -> None:
    """What every report holds: goodput ≤ 100%, productive + badput = wall (1%), a done run kept every step."""
    assert 0 <= doc["goodput"] <= 1.0 and doc["productive_s"] <= doc["wall_s"], doc
    total = doc["productive_s"] + sum(doc["badput_s"].values())
    assert abs(total - doc["wall_s"]) <= 0.01 * doc["wall_s"] + 0.01, (total, doc["wall_s"])
    if doc["outcome"] == "done":
        assert doc["steps_kept"] == (doc["final_step"] or 0), doc  # a trainer that saves nothing keeps 0


def live_node(settings: Settings, run_id: str) -> str | None:
    """The run's READY node id, if there is one."""
    nodes = [n for n in TpuApi(settings).list_nodes(ZONE) if n.node_id.startswith(run_id) and n.state == "READY"]
    return nodes[0].node_id if nodes else None


def blob_exists(gcs: Any, bucket: str, key: str) -> bool:
    return bool(gcs.bucket(bucket).blob(key).exists())


def params_bytes(gcs: Any, bucket: str, step_prefix: str) -> bytes:
    """Every parameter part of a step, concatenated in order (bytes, for bit-identity)."""
    blobs = sorted(gcs.list_blobs(bucket, prefix=f"{step_prefix}/params/part-"), key=lambda b: b.name)
    parts = [np.load(io.BytesIO(b.download_as_bytes())) for b in blobs]
    return np.concatenate(parts).tobytes()


def run_reference_locally(env: dict[str, str], checkpoint_dir: str, steps: int, every: int, hp: str) -> None:
    """The reference trainer uninterrupted, as one process (the baseline for bit-identity)."""
    contract = {"TPU_OPS_RUN_ID": "baseline", "TPU_OPS_WORKER": "0", "TPU_OPS_WORKERS": "1",
                "TPU_OPS_CHECKPOINT_DIR": checkpoint_dir, "TPU_OPS_STEPS": str(steps),
                "TPU_OPS_CHECKPOINT_EVERY": str(every), "TPU_OPS_HYPERPARAMETERS": hp}  # fmt: skip
    # A worker's environment has no OPENBLAS_* (the host simulator passes nothing of the host's); this
    # machine sets OPENBLAS_CORETYPE, which picks other kernels and so other rounding: drop it here too.
    env = {k: v for k, v in env.items() if not k.startswith("OPENBLAS_")}
    subprocess.run([sys.executable, "-m", "tpu_ops.train.reference"], env={**env, **contract}, check=True,
                   capture_output=True, timeout=120)  # fmt: skip


CLI = str(Path(sys.executable).with_name("tpu-ops"))


class Cli:
    """``tpu-ops train --no-flow --json`` for one spec and run id, as separate processes."""

    def __init__(self, stack: Any, settings: Any, tmp_path: Path, bucket: str, run_id: str, **train: Any) -> None:
        self.spec = tmp_path / f"{run_id}.yaml"
        doc = json.loads(job_spec(bucket, **train).model_dump_json())
        self.spec.write_text(yaml.safe_dump(doc))
        self.run_id, self.tmp = run_id, tmp_path
        self.env = {**os.environ, **stack.env(), "TPU_OPS_STATE_DIR": str(settings.state_dir),
                    "TPU_OPS_POLL_INTERVAL_S": "0.1"}  # fmt: skip
        self.n = 0
        self.number: dict[int, int] = {}  # pid -> which start it was (names its output files)

    def start(self) -> subprocess.Popen[bytes]:
        self.n += 1
        out = (self.tmp / f"{self.run_id}-{self.n}.out").open("wb")
        err = (self.tmp / f"{self.run_id}-{self.n}.err").open("wb")
        proc = subprocess.Popen([CLI, "train", "--spec", str(self.spec), "--run-id", self.run_id, "--no-flow",
                                 "--json"], env=self.env, stdout=out, stderr=err)  # fmt: skip
        self.number[proc.pid] = self.n
        return proc

    def finish(self, proc: subprocess.Popen[bytes], timeout: float = 150) -> tuple[int, str, str]:
        rc = proc.wait(timeout)
        n = self.number[proc.pid]
        return rc, (self.tmp / f"{self.run_id}-{n}.out").read_text(), (self.tmp / f"{self.run_id}-{n}.err").read_text()


def kill9(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
