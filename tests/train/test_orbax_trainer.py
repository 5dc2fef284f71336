"""A real JAX + orbax-checkpoint trainer (CPU, from PyPI) as ``train.command`` on a 2-host slice,
preempted once while a save is in flight, ends with the parameters of an uninterrupted run.

Its runtime reaches the bare-image workers as a user's would: a wheelhouse downloaded once from the
package index into ``.tpu-ops/orbax-wheelhouse`` (``examples/orbax_trainer/constraints.txt`` pins every
wheel), uploaded to the fake GCS, and installed on each worker by ``train.setup`` with ``pip install
--no-index --find-links``. The test sets no variable for the trainer: it sees only the job contract
and what the host gives every VM. ~2-4 min on 2 cores, so it is deselected by default: ``make
orbax-check`` (CI runs it after ``make test``).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from train_helpers import ZONE, Run, job_spec, live_node, wait_for

from infra.local.wheelhouse import ORBAX_EXAMPLE, ORBAX_SETUP, pypi_wheelhouse, upload_orbax_runtime

pytestmark = [pytest.mark.orbax, pytest.mark.usefixtures("nothing_left")]
ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / ".tpu-ops" / "orbax-wheelhouse"
STEPS, EVERY = 60, 10
HP = {"size": 262144, "learning_rate": 0.05, "seed": 3, "step_delay_s": 0.1}


@pytest.fixture(scope="module")
def wheelhouse() -> Path:
    return pypi_wheelhouse(CACHE)


def _baseline(wheelhouse: Path, tmp_path: Path) -> list[bytes]:
    """The same trainer uninterrupted: two local processes in a venv installed from the same wheels,
    checkpointing to a local directory (storage does not change the arithmetic)."""
    venv = CACHE.parent / "orbax-venv"
    if not (venv / ".installed").exists():
        base = getattr(sys, "_base_executable", None) or sys.executable
        subprocess.run([base, "-m", "venv", "--clear", "--without-pip", str(venv)], check=True, timeout=120)
        pip = next(wheelhouse.glob("pip-*.whl")) / "pip"
        subprocess.run([str(venv / "bin" / "python"), str(pip), "install", "-q", "--no-index", "--no-compile",
                        "--find-links", str(wheelhouse), "-r", str(ORBAX_EXAMPLE / "requirements.txt"),
                        "-c", str(ORBAX_EXAMPLE / "constraints.txt")], check=True, timeout=600)  # fmt: skip
        (venv / ".installed").touch()
    ckpt = tmp_path / "baseline"
    contract = {"JAX_COORDINATOR_ADDRESS": "127.0.0.1:18477", "JAX_NUM_PROCESSES": "2",
                "TPU_OPS_STEPS": str(STEPS), "TPU_OPS_CHECKPOINT_EVERY": str(EVERY),
                "TPU_OPS_CHECKPOINT_DIR": str(ckpt), "TPU_OPS_HYPERPARAMETERS": json.dumps(HP, sort_keys=True),
                "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}  # fmt: skip
    procs = [subprocess.Popen([str(venv / "bin" / "python"), str(ORBAX_EXAMPLE / "train.py")],
                              env={**contract, "JAX_PROCESS_ID": str(p)}, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT) for p in (0, 1)]  # fmt: skip
    for p in procs:
        out, _ = p.communicate(timeout=300)
        assert p.returncode == 0, out.decode(errors="replace")[-3000:]
    return [(ckpt / "result" / f"shard-{i}.npy").read_bytes() for i in (0, 1)]


def _saving(gcs: Any, bucket: str, run: str) -> int | None:
    """A step of at least 2 * EVERY whose directory exists in the bucket without its commit marker."""
    names = [b.name for b in gcs.list_blobs(bucket, prefix=f"runs/{run}/")]
    started, committed = set(), set()
    for n in names:
        m = re.match(rf"runs/{run}/(\d+)/(.*)$", n)
        if m:
            (committed if m.group(2) == "commit_success.txt" else started).add(int(m.group(1)))
    partial = sorted(s for s in started - committed if s >= 2 * EVERY)
    return partial[0] if partial else None


def test_a_jax_orbax_trainer_preempted_during_a_save_ends_with_the_uninterrupted_parameters(
    stack: Any, gcs: Any, ckpt_bucket: str, train_settings: Any, wheelhouse: Path, tmp_path: Path
) -> None:
    t0 = time.monotonic()
    rt = upload_orbax_runtime(train_settings, f"gs://{ckpt_bucket}/orbax-runtime", wheelhouse)
    job = job_spec(
        ckpt_bucket, "v4-16", steps=STEPS, checkpoint_every=EVERY, hyperparameters=HP, term_grace=4,
        setup=["bash", "-c", ORBAX_SETUP, "setup", rt], command=["venv/bin/python", "rt/train.py"],
        stall_limit="300s", heartbeat_interval=0.5,
    )  # fmt: skip
    run = Run(job, "orbax", train_settings)

    def in_flight() -> int | None:
        if not run.thread.is_alive():
            run.result(0)  # the run ended first: its error (or report) says why
            raise AssertionError("the run ended before a save was seen in flight")
        return _saving(gcs, ckpt_bucket, "orbax")

    saving = wait_for(in_flight, timeout=400, what="a save in flight")
    node = live_node(train_settings, "orbax")
    assert node is not None
    stack.preempt(ZONE, node)  # the fake TPU API's own path: every host gets SIGTERM, SIGKILL after the grace
    preempted_at = time.monotonic() - t0
    report = run.result(timeout=600)
    elapsed = time.monotonic() - t0

    assert report.outcome == "done" and report.final_step == STEPS and len(report.preemptions) == 1
    resumed = report.preemptions[0].resume_step
    assert resumed is not None and resumed >= EVERY
    workers = stack.hosts.workers(ZONE, report.incarnations[-1].queued_resource)
    assert len(workers) == 2
    for w in workers:
        log = (w.workdir / "orbax" / "trainer.log").read_text()
        assert f"restored step {resumed}" in log and f"done at step {STEPS}" in log, log[-2000:]
    shards = [gcs.bucket(ckpt_bucket).blob(f"runs/orbax/result/shard-{i}.npy").download_as_bytes() for i in (0, 1)]
    assert shards == _baseline(wheelhouse, tmp_path)  # bit for bit
    print(f"\norbax: save of step {saving} in flight at preemption ({preempted_at:.1f}s), resumed from {resumed}, "
          f"{elapsed:.1f}s for the run, {time.monotonic() - t0:.1f}s with the baseline", file=sys.stderr)  # fmt: skip
