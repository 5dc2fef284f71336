"""The per-worker training agent: resume step → trainer → heartbeats → exit report → DONE.

What ``tpu-ops-agent run --job gs://…/_tpu_ops/job.json`` does on every worker of a slice:

1. reads who it is from the metadata server and the job spec from GCS; exits at once if the
   run-level ``DONE`` marker exists (a recreated VM has a fresh disk, so the marker is in GCS);
2. resolves the resume step with the checkpoint finder and starts the trainer with the job
   contract's ``TPU_OPS_*`` variables (and the JAX coordinator address from the worker endpoints);
3. writes ``heartbeats/worker-<n>.json`` (step, time, worker) every ``heartbeat_s``;
4. on SIGTERM, forwards it to the trainer and SIGKILLs it after ``term_grace_s``;
5. reports the exit status and the tail of the trainer's log in ``workers/worker-<n>.json``;
   worker 0 writes ``DONE`` once every worker of this incarnation exited 0.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from tpu_ops.agent.goodput_hooks import GoodputHooks
from tpu_ops.agent.metadata import MetadataClient, WorkerIdentity
from tpu_ops.cloud.clients import storage_client
from tpu_ops.errors import TpuOpsError
from tpu_ops.settings import Settings, child_environment
from tpu_ops.train.checkpoints import latest_complete_step
from tpu_ops.train.layout import RunLayout, exists, get_json, list_json, put_json
from tpu_ops.uris import parse_gs

LOG_TAIL_BYTES = 4000
DONE_WAIT_S = 120.0
# Runs ``module:function`` (or ``module`` as __main__) without putting either into code text.
ENTRY = (
    "import importlib, runpy, sys\n"
    "mod, _, fn = sys.argv[1].partition(':')\n"
    "sys.argv = [mod]\n"
    "sys.exit(getattr(importlib.import_module(mod), fn)() if fn else runpy.run_module(mod, run_name='__main__'))\n"
)


@dataclass
class Job:
    """The job spec the supervisor uploads to ``RUN/_tpu_ops/job.json``."""

    run_id: str
    run_uri: str
    steps: int
    checkpoint_every: int
    command: list[str] | None = None
    trainer: str = "tpu_ops.train.reference:main"
    checkpoint_subdir: str = ""
    dataset_manifest: str | None = None
    hyperparameters: dict[str, Any] = field(default_factory=dict)
    heartbeat_s: float = 5.0
    term_grace_s: float = 30.0
    coordinator_port: int = 8476
    incarnation: str = ""  # written by the supervisor before it asks for the slice
    goodput: dict[str, Any] = field(default_factory=dict)  # step records, Cloud Logging (agent.goodput_hooks)

    @property
    def layout(self) -> RunLayout:
        return RunLayout(self.run_uri, self.checkpoint_subdir)

    def argv(self) -> list[str]:
        return list(self.command) if self.command else [sys.executable, "-c", ENTRY, self.trainer]


def contract_env(job: Job, who: WorkerIdentity, resume: int | None, progress: Path) -> dict[str, str]:
    """The job contract's variables for one worker (README, "Training")."""
    coordinator = f"{who.endpoints[0] if who.endpoints else '127.0.0.1'}:{job.coordinator_port}"
    env = {
        "TPU_OPS_RUN_ID": job.run_id,
        "TPU_OPS_WORKER": str(who.worker_number),
        "TPU_OPS_WORKERS": str(who.worker_count),
        "TPU_OPS_CHECKPOINT_DIR": job.layout.steps_uri,
        "TPU_OPS_STEPS": str(job.steps),
        "TPU_OPS_CHECKPOINT_EVERY": str(job.checkpoint_every),
        "TPU_OPS_HYPERPARAMETERS": json.dumps(job.hyperparameters, sort_keys=True),
        "TPU_OPS_PROGRESS_FILE": str(progress),
        "TPU_OPS_COORDINATOR_ADDRESS": coordinator,
        "JAX_COORDINATOR_ADDRESS": coordinator,
        "JAX_NUM_PROCESSES": str(who.worker_count),
        "JAX_PROCESS_ID": str(who.worker_number),
    }
    if resume is not None:
        env["TPU_OPS_RESUME_STEP"] = str(resume)
    if job.dataset_manifest:
        env["TPU_OPS_DATASET_MANIFEST"] = job.dataset_manifest
    return env


def _tail(path: Path) -> str:
    try:
        with path.open("rb") as f:
            f.seek(max(0, path.stat().st_size - LOG_TAIL_BYTES))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def _read_step(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


class Agent:
    """One worker's agent for one incarnation of the slice."""

    def __init__(
        self, settings: Settings, job_uri: str, incarnation: str, warm: subprocess.Popen[bytes] | None = None
    ) -> None:
        self.settings = settings
        self.warm = warm
        self.gcs = storage_client(settings)
        self.job = Job(**get_json(self.gcs, parse_gs(job_uri)))
        self.layout = self.job.layout
        self.incarnation = incarnation or self.job.incarnation
        self.who = MetadataClient(settings).identity()
        self.workdir = Path(settings.worker_dir or tempfile.mkdtemp(prefix="tpu-ops-agent-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.goodput = GoodputHooks(
            self.workdir,
            self.who.worker_number,
            self.job.goodput,
            self.incarnation,
            MetadataClient(settings).get,
            settings.logging_endpoint,
            settings.dry_run,
        )
        self.term_at: float | None = None
        self.first_step_at: float | None = None  # wall time the trainer's first new step was seen
        self.proc: subprocess.Popen[bytes] | None = None

    def _on_term(self, signum: int, frame: FrameType | None) -> None:
        if self.term_at is None:
            self.term_at = time.monotonic()
            if self.proc is not None and self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)

    def _heartbeat(self, step: int | None, resume: int | None, log: Path, state: str) -> None:
        doc = {"worker": self.who.worker_number, "step": step, "resume_step": resume, "time": time.time(),
               "log_bytes": log.stat().st_size if log.exists() else 0, "incarnation": self.incarnation,
               "state": state, "first_step_at": self.first_step_at, **self.goodput.heartbeat_fields(state)}  # fmt: skip
        try:
            put_json(self.gcs, self.layout.heartbeat(self.who.worker_number), doc)
        except TpuOpsError as exc:  # a missed heartbeat must not kill training
            print(f"tpu-ops agent: heartbeat failed: {exc}", file=sys.stderr, flush=True)

    def run(self) -> int:
        """Train (or not, if the run is done); return the trainer's exit status."""
        if exists(self.gcs, self.layout.done):
            print(f"tpu-ops agent: run {self.job.run_id} is already done; nothing to train", flush=True)
            self._release(None)
            return 0
        resume = latest_complete_step(self.gcs, self.layout.steps_uri)
        progress, log = self.workdir / "progress", self.workdir / "trainer.log"
        progress.unlink(missing_ok=True)
        if self.job.dataset_manifest and not self._preflight(resume, log):
            self._release(None)
            return 1
        env = {**contract_env(self.job, self.who, resume, progress), **self.goodput.env()}
        start = f"resuming from step {resume}" if resume is not None else "fresh start"
        if self.warm is not None and self.warm.poll() is None:
            start += " (trainer imported while the agent started)"
        print(f"tpu-ops agent: worker {self.who.worker_number}/{self.who.worker_count} of {self.job.run_id}: {start}")
        sys.stdout.flush()
        signal.signal(signal.SIGTERM, self._on_term)
        if self.warm is not None and self.warm.poll() is None:
            self.proc = self.warm  # already imported: hand it its environment
            self._release(env)
        else:
            self._release(None)
            with log.open("ab") as out:
                self.proc = subprocess.Popen(self.job.argv(), stdout=out, stderr=subprocess.STDOUT, cwd=self.workdir,
                                             env=child_environment(env, drop=("TPU_OPS_RESUME_STEP",)))  # fmt: skip
        rc = self._watch(resume, progress, log)
        step = _read_step(progress)
        self._heartbeat(step, resume, log, "exited")
        # Told to stop (SIGTERM to the agent or the trainer) = the host going away, not the trainer failing.
        terminated = self.term_at is not None or rc == -signal.SIGTERM
        report = {"worker": self.who.worker_number, "incarnation": self.incarnation, "exit_code": rc,
                  "terminated": terminated, "resume_step": resume, "last_step": step,
                  "log_tail": _tail(log), "time": time.time(), "node": self.who.node_id}  # fmt: skip
        put_json(self.gcs, self.layout.worker_report(self.who.worker_number), report)
        print(f"tpu-ops agent: trainer exited {rc} at step {step}", flush=True)
        if rc == 0 and self.who.worker_number == 0 and self.term_at is None:
            self._commit_done()
        return rc

    def _release(self, env: dict[str, str] | None) -> None:
        from tpu_ops.agent.warm import release

        if self.warm is not None and self.warm.poll() is None:
            release(self.warm, env)
            if env is None:
                self.warm.wait(timeout=30)

    def _preflight(self, resume: int | None, log: Path) -> bool:
        """Verify the pinned snapshot before training (report under ``RUN/_tpu_ops/preflight/``)."""
        from tpu_ops.agent.preflight import preflight

        assert self.job.dataset_manifest is not None
        try:
            report = preflight(self.settings, self.job.run_id, self.job.dataset_manifest,
                               str(self.layout.state("preflight")))  # fmt: skip
        except TpuOpsError as exc:  # the snapshot differs or cannot be read: the job's input is wrong
            log.write_text(f"pre-flight failed: {type(exc).__name__}: {exc}\n")
            put_json(self.gcs, self.layout.worker_report(self.who.worker_number), {
                "worker": self.who.worker_number, "incarnation": self.incarnation, "exit_code": 1,
                "terminated": False, "resume_step": resume, "last_step": None, "log_tail": _tail(log),
                "time": time.time(), "node": self.who.node_id})  # fmt: skip
            return False
        print(f"tpu-ops agent: verified snapshot {report.snapshot_id}: {report.objects_checked} objects", flush=True)
        return True

    def _watch(self, resume: int | None, progress: Path, log: Path) -> int:
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
                self._heartbeat(step, resume, log, "running")
                last_beat = time.monotonic()
            try:
                return self.proc.wait(timeout=0.1)
            except subprocess.TimeoutExpired:
                pass
            if self.term_at is not None and time.monotonic() - self.term_at > self.job.term_grace_s:
                self.proc.kill()

    def _commit_done(self) -> None:
        """Worker 0: DONE once every worker of this incarnation reported exit 0."""
        deadline = time.monotonic() + DONE_WAIT_S
        while time.monotonic() < deadline:
            reports = [r for r in list_json(self.gcs, self.layout.workers) if r.get("incarnation") == self.incarnation]
            if any(r["exit_code"] != 0 for r in reports):
                return
            if len({r["worker"] for r in reports}) >= self.who.worker_count:
                put_json(self.gcs, self.layout.done, {"run_id": self.job.run_id, "time": time.time(),
                                                      "incarnation": self.incarnation})  # fmt: skip
                print(f"tpu-ops agent: run {self.job.run_id} done", flush=True)
                return
            time.sleep(0.2)
        print("tpu-ops agent: not every worker reported success; no DONE marker", file=sys.stderr, flush=True)


def run(settings: Settings, job_uri: str, incarnation: str, warm: subprocess.Popen[bytes] | None = None) -> int:
    """Run this worker's part of the job; the trainer's exit status (128+N if it died of signal N)."""
    rc = Agent(settings, job_uri, incarnation, warm).run()
    return 128 - rc if rc < 0 else rc
