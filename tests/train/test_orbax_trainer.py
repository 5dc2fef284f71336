"""A real JAX + orbax-checkpoint trainer (CPU, from PyPI) as ``train.command``: on a 2-host slice and on
2 slices of 1 host (issue 29), each preempted once while a save is in flight, and through 2 hosts ->
1 host with accumulation 2 -> 2 hosts (issue 27); each ends with the parameters of an uninterrupted run
(docs/orbax-trainer.md).

Its runtime reaches the bare-image workers as a user's would: a wheelhouse downloaded once from the
package index into ``.tpu-ops/orbax-wheelhouse`` (``examples/orbax_trainer/constraints.txt`` pins every
wheel), uploaded to the fake GCS, and installed on each worker by ``train.setup`` with ``pip install
--no-index --find-links``. The stack tests set no variable for the trainer: it sees only the job
contract and what the host gives every VM. Minutes on 2 cores, so deselected by default: ``make
orbax-check`` (CI runs it after ``make test``).
"""

from __future__ import annotations

import io
import json
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
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


@pytest.fixture(scope="module")
def python(wheelhouse: Path) -> Path:
    """A local venv installed from the same wheels as the workers (for runs driven without the agent)."""
    venv = CACHE.parent / "orbax-venv"
    if not (venv / ".installed").exists():
        base = getattr(sys, "_base_executable", None) or sys.executable
        subprocess.run([base, "-m", "venv", "--clear", "--without-pip", str(venv)], check=True, timeout=120)
        pip = next(wheelhouse.glob("pip-*.whl")) / "pip"
        subprocess.run([str(venv / "bin" / "python"), str(pip), "install", "-q", "--no-index", "--no-compile",
                        "--find-links", str(wheelhouse), "-r", str(ORBAX_EXAMPLE / "requirements.txt"),
                        "-c", str(ORBAX_EXAMPLE / "constraints.txt")], check=True, timeout=600)  # fmt: skip
        (venv / ".installed").touch()
    return venv / "bin" / "python"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(python: Path, n: int, ckpt: str, env: dict[str, str], log: Path) -> list[subprocess.Popen[bytes]]:
    """``n`` trainer processes as the agent starts them: the job contract's variables and nothing else
    of this machine (``env`` adds the VM's own: the emulator's address, a slice count, an accumulation)."""
    contract = {"TPU_OPS_RUN_ID": "local", "TPU_OPS_COORDINATOR_ADDRESS": f"127.0.0.1:{_free_port()}",
                "TPU_OPS_PROCESSES": str(n), "TPU_OPS_STEPS": str(STEPS), "TPU_OPS_CHECKPOINT_EVERY": str(EVERY),
                "TPU_OPS_CHECKPOINT_DIR": ckpt, "TPU_OPS_HYPERPARAMETERS": json.dumps(HP, sort_keys=True),
                "PATH": "/usr/bin:/bin", "HOME": str(log.parent), **env}  # fmt: skip
    return [subprocess.Popen([str(python), str(ORBAX_EXAMPLE / "train.py")], stderr=subprocess.STDOUT,
                             stdout=log.with_suffix(f".{p}.log").open("ab"),
                             env={**contract, "TPU_OPS_PROCESS_ID": str(p)}) for p in range(n)]  # fmt: skip


def _join(procs: list[subprocess.Popen[bytes]], log: Path, code: int = 0) -> str:
    """Wait for every process; each must exit with ``code``. Returns their output."""
    for p in procs:
        p.wait(timeout=300)
    out = "".join(log.with_suffix(f".{i}.log").read_text(errors="replace") for i in range(len(procs)))
    assert [p.returncode for p in procs] == [code] * len(procs), out[-3000:]
    return out


@pytest.fixture(scope="module")
def baseline(python: Path, tmp_path_factory: pytest.TempPathFactory) -> np.ndarray:
    """The trainer uninterrupted on the target shape: two local processes, one slice, accumulation 1,
    checkpointing to a local directory (storage does not change the arithmetic)."""
    tmp = tmp_path_factory.mktemp("orbax-baseline")
    _join(_start(python, 2, str(tmp / "ckpt"), {}, tmp / "run"), tmp / "run")
    return np.load(tmp / "ckpt" / "result" / "params.npy")


def _result(gcs: Any, bucket: str, run: str) -> np.ndarray:
    return np.load(io.BytesIO(gcs.bucket(bucket).blob(f"runs/{run}/result/params.npy").download_as_bytes()))


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
    stack: Any, gcs: Any, ckpt_bucket: str, train_settings: Any, wheelhouse: Path, baseline: np.ndarray
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
    assert _result(gcs, ckpt_bucket, "orbax").tobytes() == baseline.tobytes()  # bit for bit
    print(
        f"\norbax: save of step {saving} in flight at preemption ({preempted_at:.1f}s), resumed from {resumed}, "
        f"{elapsed:.1f}s for the run",
        file=sys.stderr,
    )


def test_two_slices_of_one_host_one_slice_preempted_during_a_save_resume_bit_identical(
    stack: Any, gcs: Any, ckpt_bucket: str, train_settings: Any, wheelhouse: Path, baseline: np.ndarray
) -> None:
    """Issue 29: 2 x v4-8 (one host each) as one distributed job, slice 1 preempted while a save is in
    flight; the healthy slice kept, the lost one repaired, the result the uninterrupted run's bit for bit."""
    t0, run_id = time.monotonic(), "orbax-ms"
    rt = upload_orbax_runtime(train_settings, f"gs://{ckpt_bucket}/orbax-runtime", wheelhouse)
    job = job_spec(
        ckpt_bucket, "v4-8", steps=STEPS, checkpoint_every=EVERY, hyperparameters=HP, term_grace=10,
        setup=["bash", "-c", ORBAX_SETUP, "setup", rt], command=["venv/bin/python", "rt/train.py"],
        stall_limit="300s", heartbeat_interval=0.5,
    )  # fmt: skip
    job = job.model_copy(update={"provision": job.provision.model_copy(
        update={"slice": job.provision.slice.model_copy(update={"slices": 2})})})  # fmt: skip
    run = Run(job, run_id, train_settings)

    def in_flight() -> int | None:
        if not run.thread.is_alive():
            run.result(0)
            raise AssertionError("the run ended before a save was seen in flight")
        return _saving(gcs, ckpt_bucket, run_id)

    saving = wait_for(in_flight, timeout=400, what="a save in flight")
    lost = f"{run_id}-a1-1"  # slice 1: node 1 of the allocation's one queued resource (-a1)
    assert wait_for(lambda: live_node(train_settings, lost), what="slice 1's node") == lost
    stack.preempt(ZONE, lost)
    report = run.result(timeout=600)

    assert report.outcome == "done" and report.final_step == STEPS and len(report.preemptions) == 1
    p = report.preemptions[0]
    assert p.queued_resource == lost and p.resume_step is not None and p.resume_step >= EVERY
    alloc = json.loads(gcs.bucket(ckpt_bucket).blob(f"runs/{run_id}/_tpu_ops/allocation.json").download_as_bytes())
    # Google repaired node 1 in the same request and restarted node 0's VMs: the request is kept whole
    assert alloc["kept"] == [0, 1] and [s["hosts"] for s in alloc["slices"]] == [1, 1]
    for s in alloc["slices"]:  # the restarted job: 2 processes over the 2 live slices, from the live allocation
        (w,) = stack.hosts.workers(ZONE, s["id"])
        log = (w.workdir / run_id / "trainer.log").read_text()
        assert f"process {s['index']} of 2, slice {s['index']} of 2 (MEGASCALE_NUM_SLICES=2)" in log, log[-2000:]
        assert f"restored step {p.resume_step}" in log and f"done at step {STEPS}" in log, log[-2000:]
    # params replicated across slices, the batch split over them: the same arithmetic as 1 slice of 2 hosts
    assert _result(gcs, ckpt_bucket, run_id).tobytes() == baseline.tobytes()  # bit for bit
    print(f"\norbax multislice: save of step {saving} in flight when slice 1 was preempted, resumed from "
          f"{p.resume_step}, {time.monotonic() - t0:.1f}s", file=sys.stderr)  # fmt: skip


# Issue 27: 1e-5 relative (L2 norm of the difference over the norm), as float32 summation order allows:
# on 1 process with accumulation 2 the gradient is summed micro-batch by micro-batch instead of by an
# all-reduce over 2 processes. (On this CPU build the two orders happen to round alike; not promised.)
ELASTIC_RTOL = 1e-5


def test_two_hosts_then_one_with_accumulation_then_two_keep_the_target_training(
    stack: Any, gcs: Any, ckpt_bucket: str, python: Path, baseline: np.ndarray, tmp_path: Path
) -> None:
    """Issue 27, driven as the agent would: the job contract's variables, the stack's GCS, SIGTERM as a
    preemption (the notice path saves the step in hand), the resume step the newest complete one."""
    from infra.local.hostsim import WORKER_ENV
    from tpu_ops.train.checkpoints import latest_complete_step

    vm = {k: v for k, v in stack.env().items() if k in WORKER_ENV}
    uri = f"gs://{ckpt_bucket}/runs/elastic"
    target = {"TPU_OPS_TARGET_CHIPS": "8", "TPU_OPS_TARGET_SHAPE": "v4-16"}
    phases = [  # (processes, what the agent adds), v4-16 is 2 hosts of 4 chips, v4-8 one
        (2, {**target, "TPU_OPS_CHIPS": "8", "TPU_OPS_SHAPE": "v4-16"}),
        (1, {**target, "TPU_OPS_CHIPS": "4", "TPU_OPS_SHAPE": "v4-8", "TPU_OPS_ACCUM_STEPS": "2"}),
        (2, {**target, "TPU_OPS_CHIPS": "8", "TPU_OPS_SHAPE": "v4-16"}),
    ]
    resumed: list[int] = []
    for n, (procs, extra) in enumerate(phases):
        log = tmp_path / f"phase{n}"
        resume = {"TPU_OPS_RESUME_STEP": str(resumed[-1])} if resumed else {}
        running = _start(python, procs, uri, {**vm, **extra, **resume}, log)
        if n == len(phases) - 1:
            out = _join(running, log)
            break
        after = resumed[-1] if resumed else 0

        # a committed step later than this phase's start, then a preemption: every process gets SIGTERM
        def saved(after: int = after, running: list[subprocess.Popen[bytes]] = running, log: Path = log) -> bool:
            if any(p.poll() is not None for p in running):  # a process ended before its preemption: say why
                _join(running, log, code=143)
            return (latest_complete_step(gcs, uri) or 0) > after

        wait_for(saved, timeout=300, what=f"a step of phase {n} committed")
        for p in running:
            p.send_signal(signal.SIGTERM)
        out = _join(running, log, code=143)
        assert "preempted, saved step" in out and (f"restored step {after}" in out or not after), out[-2000:]
        resumed.append(latest_complete_step(gcs, uri) or 0)
        assert resumed[-1] > after
        if n == 1:  # the one process did the target's step in 2 micro-batches
            assert (
                "process 0 of 1, slice 0 of 1 (MEGASCALE_NUM_SLICES=-): 524288 parameters, "
                "batch 4 in 2 micro-batch(es)" in out
            ), out[-2000:]
    assert f"restored step {resumed[-1]}" in out and f"done at step {STEPS}" in out, out[-2000:]
    final = _result(gcs, ckpt_bucket, "elastic")
    rel = float(np.linalg.norm(final - baseline) / np.linalg.norm(baseline))
    assert final.shape == baseline.shape and rel <= ELASTIC_RTOL, rel
    print(
        f"\norbax elastic: 2 hosts -> 1 (accumulation 2) at step {resumed[0]} -> 2 at {resumed[1]}, "
        f"relative difference {rel:.2e} (bit-identical: {final.tobytes() == baseline.tobytes()})",
        file=sys.stderr,
    )
