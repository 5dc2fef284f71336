"""The per-worker training agent: setup → resume step → trainer → heartbeats → exit report → DONE.

Standard library only (Python ≥ 3.10), so it runs on a TPU image's own interpreter. What
``tpu-ops-agent run --job gs://…/_tpu_ops/job.json`` does on every worker of a slice:

1. reads who it is from the metadata server and the job spec from GCS; exits at once if the
   run-level ``DONE`` marker exists (a recreated VM has a fresh disk, so the marker is in GCS);
2. runs the job's ``setup`` command once per VM disk (its output and exit status are reported like
   the trainer's; a failure is the job's own, never a preemption);
3. resolves the resume step with the checkpoint finder and starts the trainer with the job
   contract's variables (``TPU_OPS_*``, the JAX coordinator, ``TPU_WORKER_ID``/``_HOSTNAMES``);
4. writes ``heartbeats/worker-<n>.json`` (step, time, worker) every ``heartbeat_s``;
5. on SIGTERM (a spot preemption's ACPI soft-off, or maintenance) writes
   ``notices/worker-<n>.json`` at once, forwards SIGTERM to the trainer and SIGKILLs it once
   ``term_grace_s`` has passed since the signal;
6. reports the exit status and the tail of the log in ``workers/worker-<n>.json``; worker 0 writes
   ``DONE`` once every worker of this incarnation exited 0.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from types import FrameType
from typing import Any

from tpu_ops.agent.allocation import commit_done, next_incarnation, stop_requested, wait_for_document, write_notice
from tpu_ops.agent.checkpoints import latest_complete_step
from tpu_ops.agent.gcs import Gcs, GcsError
from tpu_ops.agent.goodput_hooks import GoodputHooks
from tpu_ops.agent.job import ENTRY as ENTRY  # the old import paths
from tpu_ops.agent.job import MEGASCALE_PORT, STANDBY_KEY, contract_env, host_key, placement, shape_env
from tpu_ops.agent.job import Job as Job
from tpu_ops.agent.logship import LogShipper
from tpu_ops.agent.loopback import TRUE, LoopbackError, check_trainer_env
from tpu_ops.agent.metadata import Metadata
from tpu_ops.agent.setup import read_step as _read_step
from tpu_ops.agent.setup import run_setup
from tpu_ops.agent.setup import size as _size
from tpu_ops.agent.setup import tail as _tail
from tpu_ops.agent.warm import release


class Agent:
    """One worker's agent for one incarnation of the slice."""

    def __init__(
        self,
        job_uri: str,
        incarnation: str,
        warm: subprocess.Popen[bytes] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.env = dict(os.environ if env is None else env)
        self.warm = warm
        metadata = Metadata.from_env(self.env)
        self.gcs = Gcs.from_env(self.env, metadata)
        from tpu_ops.agent.gcs import split_gs

        self.job = Job.from_json(self.gcs.read_json(*split_gs(job_uri)))
        self.paths = self.job.paths(job_uri)
        self.bucket = self.paths.bucket
        self.incarnation = incarnation or self.job.incarnation  # the supervisor writes it before asking
        self.who = metadata.identity()
        # Which slice of the allocation this VM is on: the launch sets it per slice on Compute Engine; a TPU API
        # multislice request has one metadata for every node, and Google's tpu-env names the slice.
        which = metadata.optional("tpu-ops-slice") or metadata.tpu_env().get("MEGASCALE_SLICE_ID") or "0"
        self.slice = int(which.strip() or 0)
        self.where = placement(self.who, self.slice)  # until the allocation document says more
        self.standby = (metadata.optional(STANDBY_KEY) or "").strip().lower() in TRUE  # a move's new slice
        self.workdir = Path(self.env.get("TPU_OPS_WORKER_DIR") or tempfile.mkdtemp(prefix="tpu-ops-agent-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.log = self.workdir / "trainer.log"
        self.setup_log = self.workdir / "setup.log"
        self.setup_s: float | None = None
        self._metadata_get = metadata.get
        self._signalled = False
        self._begin(self.incarnation)

    def _begin(self, incarnation: str) -> None:
        """This worker's part of ``incarnation`` (again, on a slice kept while another was replaced)."""
        self.incarnation = incarnation
        self.shipper = LogShipper(self.gcs, self.paths, incarnation, self.who.worker_number, self.log, self.slice)
        self.goodput = GoodputHooks(  # the trainer's step log; worker 0's Cloud Logging entries
            self.workdir,
            self.who.worker_number if self.slice == 0 else -1,  # the run's first host writes the run's records
            self.job.goodput,
            incarnation,
            self._metadata_get,
            self.env.get("TPU_OPS_LOGGING_ENDPOINT") or None,
            (self.env.get("TPU_OPS_DRY_RUN") or "").strip().lower() in TRUE,
        )
        self.term_at: float | None = None  # monotonic time of the SIGTERM
        self.first_step_at: float | None = None  # wall time the trainer's first new step was seen
        self.proc: subprocess.Popen[bytes] | None = None
        self._notice: threading.Thread | None = None
        self._port = MEGASCALE_PORT
        self._allocation: dict[str, Any] | None = None  # the live allocation document, once read
        self._asked_to_stop = False

    # -- signals -------------------------------------------------------------------------------
    def _on_term(self, signum: int, frame: FrameType | None) -> None:
        self._signalled = True  # this VM is going away (a stop asked by the supervisor is not a signal)
        if self.term_at is not None:
            return
        self.term_at = time.monotonic()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        if self.job.preemption_notice:
            # Off the signal handler's stack: the main loop may be inside a GCS call of its own.
            self._notice = threading.Thread(target=self._write_notice, args=(time.time(),), daemon=True)
            self._notice.start()

    def _write_notice(self, at: float) -> None:
        doc = {
            "worker": self.who.worker_number,
            "slice": self.slice,
            "incarnation": self.incarnation,
            "time": at,
            "grace_s": self.job.term_grace_s,
            "node": self.who.node_id,
        }
        write_notice(self.gcs, self.paths, doc, self.who.worker_number, self.slice)

    # -- reports -------------------------------------------------------------------------------
    def _heartbeat(self, step: int | None, resume: int | None, state: str) -> None:
        doc = {
            "worker": self.who.worker_number,
            "slice": self.slice,
            "step": step,
            "resume_step": resume,
            "time": time.time(),
            "log_bytes": _size(self.log) + _size(self.setup_log),
            "incarnation": self.incarnation,
            "state": state,
            "first_step_at": self.first_step_at,
            "setup_s": self.setup_s,
            **self.goodput.heartbeat_fields(state),
        }
        self.shipper.ship()  # the trainer's output so far, for `tpu-ops logs`
        w, i = self.who.worker_number, self.slice
        try:  # standing by for a move: the live incarnation's workers own the heartbeat paths
            self.gcs.write_json(self.bucket, self.paths.standby(self.incarnation, w, i) if self.standby
                                else self.paths.heartbeat(w, i), doc)  # fmt: skip
        except GcsError as exc:  # a missed heartbeat must not kill training
            print(f"tpu-ops agent: heartbeat failed: {exc}", file=sys.stderr, flush=True)

    def _report(self, rc: int, resume: int | None, step: int | None, phase: str, tail: str) -> None:
        terminated = self.term_at is not None or rc == -signal.SIGTERM
        report = {
            "worker": self.who.worker_number,
            "slice": self.slice,
            "incarnation": self.incarnation,
            "exit_code": rc,
            "terminated": terminated,
            "resume_step": resume,
            "last_step": step,
            "log_tail": tail,
            "time": time.time(),
            "node": self.who.node_id,
            "phase": phase,
            "setup_s": self.setup_s,
        }
        self.gcs.write_json(self.bucket, self.paths.worker_report(self.who.worker_number, self.slice), report)

    # -- the run -------------------------------------------------------------------------------
    def run(self) -> int:
        """Train (or not, if the run is done); return the trainer's exit status."""
        if self.gcs.exists(self.bucket, self.paths.done):
            print(f"tpu-ops agent: run {self.job.run_id} is already done; nothing to train", flush=True)
            self._release(None)
            return 0
        signal.signal(signal.SIGTERM, self._on_term)
        if not self._past_stops():
            return -signal.SIGTERM
        (progress := self.workdir / "progress").unlink(missing_ok=True)
        if self.job.dataset_manifest and not self._preflight():
            self._release(None)
            return 1
        rc = self._setup()
        if rc != 0:
            self._release(None)
            self._heartbeat(None, None, "exited")
            self._report(rc, None, None, "setup", _tail(self.setup_log))
            print(f"tpu-ops agent: setup exited {rc}", file=sys.stderr, flush=True)
            return rc
        if self.term_at is not None:
            self._release(None)
            self._report(-signal.SIGTERM, None, None, "setup", _tail(self.setup_log))
            return -signal.SIGTERM
        if (self.job.slices > 1 or self.job.target_shape or self.standby) and not self._await_allocation():
            self._release(None)
            self._report(-signal.SIGTERM if self.term_at is not None else 1, None, None, "allocation", "")
            return -signal.SIGTERM if self.term_at is not None else 1
        resume = latest_complete_step(self.gcs, self.job.steps_uri)
        env = {
            **contract_env(self.job, self.who, resume, progress, self.incarnation, self.where, self._port),
            **shape_env(self.job, self._allocation),
            **self.goodput.env(),
        }
        trainer_env = {**{k: v for k, v in self.env.items() if k != "TPU_OPS_RESUME_STEP"}, **env}
        try:
            check_trainer_env(trainer_env)
        except LoopbackError as exc:  # the job's environment is wrong: fail the run, do not recover
            self._release(None)
            self.log.write_text(f"{exc}\n")
            self._report(1, resume, None, "guard", _tail(self.log))
            print(f"tpu-ops agent: {exc}", file=sys.stderr, flush=True)
            return 1
        self._start_trainer(resume, env, trainer_env)
        assert self.proc is not None
        if self.term_at is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # the signal came while the trainer was starting
        rc = self._watch(resume, progress)
        step = _read_step(progress)
        self._heartbeat(step, resume, "exited")
        self._report(rc, resume, step, "train", _tail(self.log))
        if self._notice is not None:
            self._notice.join(timeout=5)
        print(f"tpu-ops agent: trainer exited {rc} at step {step}", flush=True)
        if rc == 0 and self.where.process_id == 0 and self.term_at is None:
            self._commit_done()
        if self._asked_to_stop and (nxt := self._kept_for()) is not None:
            self._begin(nxt)  # this slice is kept: the next incarnation's workers include it
            return self.run()
        return rc

    def _past_stops(self) -> bool:
        """A VM restarted into an incarnation already stopped (Google's multislice repair restarts every node):
        this worker's part is in the next incarnation, once its allocation is written. False on SIGTERM."""
        while self.job.slices > 1 and self._stopped():
            doc = next_incarnation(self.gcs, self.paths, self.incarnation, lambda: self.term_at is not None)
            if doc is None:
                self._release(None)
                return False
            self._begin(str(doc["incarnation"]))
        return True

    def _kept_for(self) -> str | None:
        """After a stop: the next incarnation if the supervisor keeps this slice in it, else None."""
        doc = next_incarnation(self.gcs, self.paths, self.incarnation, lambda: self._signalled)
        return str(doc["incarnation"]) if doc is not None and self.slice in doc.get("kept", []) else None

    def _await_allocation(self) -> bool:
        """Until the allocation document names this incarnation (every slice up), heartbeating; then this
        worker's placement in it. False on SIGTERM or after ``allocation.WAIT_S``."""
        doc = wait_for_document(
            self.gcs,
            self.bucket,
            self.paths.allocation,
            lambda d: d.get("incarnation") == self.incarnation,
            lambda: self.term_at is not None,
            lambda: self._heartbeat(None, None, "waiting"),
            self.job.heartbeat_s,
        )
        if doc is None:
            print("tpu-ops agent: the allocation's other slices never came up", file=sys.stderr, flush=True)
            return False
        self.where, self._allocation, self.standby = placement(self.who, self.slice, doc), doc, False
        self._port = int(doc.get("megascale_port") or MEGASCALE_PORT)
        return True

    def _start_trainer(self, resume: int | None, env: dict[str, str], trainer_env: dict[str, str]) -> None:
        """The warm trainer handed its environment, or a new trainer process."""
        start = f"resuming from step {resume}" if resume is not None else "fresh start"
        warm = self.warm is not None and self.warm.poll() is None
        if warm:
            start += " (trainer imported while the agent started)"
        print(f"tpu-ops agent: worker {self.who.worker_number}/{self.who.worker_count} of {self.job.run_id}: {start}",
              flush=True)  # fmt: skip
        if warm:
            assert self.warm is not None
            self.proc = self.warm  # already imported: hand it its environment
            self._release(env)
            return
        self._release(None)
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(self.job.argv(self.workdir), stdout=out, stderr=subprocess.STDOUT,
                                         cwd=self.workdir, env=trainer_env)  # fmt: skip

    def _release(self, env: dict[str, str] | None) -> None:
        if self.warm is not None and self.warm.poll() is None:
            release(self.warm, env)
            if env is None:
                self.warm.wait(timeout=30)

    def _setup(self) -> int:
        """Run the job's setup command once per disk; its exit status."""
        if not self.job.setup:
            return 0
        env = dict(self.env)
        env.update({"TPU_OPS_AGENT_PYTHON": sys.executable, "TPU_OPS_WORKER_DIR": str(self.workdir),
                    "TPU_OPS_RUN_URI": self.job.run_uri, "TPU_OPS_WORKER": str(self.who.worker_number)})  # fmt: skip
        rc, took = run_setup(self.job, self.job.setup, env, self.workdir, self.setup_log, self)
        self.setup_s = took if took is not None else self.setup_s  # a kept disk: the first run's time
        return rc

    def _preflight(self) -> bool:
        """Verify the pinned snapshot before training (report under ``RUN/_tpu_ops/preflight/``)."""
        from tpu_ops.agent.gcs import join
        from tpu_ops.agent.preflight import SnapshotMismatch, preflight

        assert self.job.dataset_manifest is not None
        out = "gs://" + join(self.bucket, self.paths.state("preflight"))
        try:
            host = host_key(self.slice, self.who.worker_number)  # slice and host: no two workers share a report
            report = preflight(self.gcs, self.who, self.job.run_id, self.job.dataset_manifest, out, host)
        except (SnapshotMismatch, GcsError, ValueError) as exc:  # the job's input is wrong or unreadable
            self.log.write_text(f"pre-flight failed: {type(exc).__name__}: {exc}\n")
            self._report(1, None, None, "preflight", _tail(self.log))
            return False
        print(f"tpu-ops agent: verified snapshot {report.snapshot_id}: {report.objects_checked} objects", flush=True)
        return True

    def _watch(self, resume: int | None, progress: Path) -> int:
        """Check the trainer every 0.1 s; heartbeat every ``heartbeat_s``, and at once on the first new step
        (the end of a restore, which the supervisor times)."""
        assert self.proc is not None
        last_beat = 0.0
        while True:
            step = _read_step(progress)
            first = self.first_step_at is None and step is not None and step > (resume or 0)
            if first:
                self.first_step_at = time.time()
            if first or time.monotonic() - last_beat >= self.job.heartbeat_s:
                self._heartbeat(step, resume, "running")
                last_beat = time.monotonic()
                if (self.job.slices > 1 or self.job.movable) and self.term_at is None and self._stopped():
                    self._stop()
            try:
                return self.proc.wait(timeout=0.1)
            except subprocess.TimeoutExpired:
                pass
            if self.term_at is not None and time.monotonic() - self.term_at > self.job.term_grace_s:
                self.proc.kill()

    def _stopped(self) -> bool:
        """Another slice was lost, or the run moves: the supervisor asks every worker to stop (a marker)."""
        return stop_requested(self.gcs, self.paths, self.incarnation)

    def _stop(self) -> None:
        """Stop as on SIGTERM (the trainer saves the step in hand with the others), without a notice: this
        host is not being taken away."""
        self.term_at = time.monotonic()
        self._asked_to_stop = True
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        why = "the run moves to another slice" if self.job.slices == 1 else "another slice was lost"
        print(f"tpu-ops agent: {why}: stopping at the step in hand", flush=True)

    def _commit_done(self) -> None:
        commit_done(self.gcs, self.paths, self.job.run_id, self.incarnation, self.where.processes)


def run(job_uri: str, incarnation: str, warm: subprocess.Popen[bytes] | None = None,
        env: Mapping[str, str] | None = None) -> int:  # fmt: skip
    """Run this worker's part of the job; the trainer's exit status (128+N if it died of signal N)."""
    rc = Agent(job_uri, incarnation, warm, env).run()
    return 128 - rc if rc < 0 else rc
