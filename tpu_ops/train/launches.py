"""What ``tpu-ops launch`` remembers about a run, so ``status``, ``logs``, ``cancel`` and ``local
preempt`` find it by its id alone.

One JSON file per run, ``<state_dir>/launches/<run_id>/launch.json``, beside the validated spec
(``spec.json``) and the detached supervisor's own output (``supervisor.log``). The run's history
itself stays where it always is: its state in GCS (``RUN/_tpu_ops/``) and its cost ledger.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Final

from tpu_ops.layout import RunLayout, check_run_id
from tpu_ops.provision.ledger import owner_alive
from tpu_ops.settings import Settings

# The spec kinds ``launch`` runs (``tpu-ops validate``'s names).
PIPELINE: Final = "pipeline"
TRAIN_JOB: Final = "train-job"
PROVISION: Final = "provision"
KINDS: Final = (PIPELINE, TRAIN_JOB, PROVISION)
# Where the run goes on.
PROCESS: Final = "process"  # a detached ``python -m flows.commands._launched`` on this machine
PREFECT: Final = "prefect"  # a flow run of a served deployment
# Where a run was started (``status``'s FROM column): ``launch`` here, or found through Prefect: ``ui`` (the
# UI, the API or ``prefect deployment run``) or ``schedule`` (a deployment's schedule).
LAUNCH: Final = "launch"
UI: Final = "ui"
SCHEDULE: Final = "schedule"
LAUNCH_TAG: Final = "tpu-ops-launch"  # on the flow runs ``launch`` creates: another shell still says ``launch``


@dataclass
class LaunchRecord:
    """One launched run: what it is, where its supervisor runs, and how it ended (when it did)."""

    run_id: str
    kind: str
    mode: str
    launched_at: float = field(default_factory=time.time)
    checkpoint_dir: str = ""  # empty for a provision spec: no training, no run state
    checkpoint_subdir: str = ""
    zones: list[str] = field(default_factory=list)
    hosts: int = 0
    accelerator: str = ""  # the slice shape (its peak FLOPs give MFU); empty in records of older launches
    slices: int = 1
    heartbeat_s: float = 0.0
    max_duration_s: float = 0.0
    host: str = field(default_factory=socket.gethostname)
    pid: int | None = None
    flow_run_id: str = ""
    ui_url: str = ""
    ended_at: float | None = None
    exit_code: int | None = None
    outcome: str = ""  # what the detached process saw: done | failed | cancelled | provisioned
    error: str = ""
    cancelled_at: float | None = None
    cancelled_by: str = ""
    origin: str = LAUNCH

    @property
    def layout(self) -> RunLayout | None:
        """The run's GCS paths (None for a provision spec, which has no checkpoint location)."""
        if not self.checkpoint_dir:
            return None
        return RunLayout.of(self.checkpoint_dir, self.run_id, self.checkpoint_subdir)

    def supervisor_alive(self) -> bool | None:
        """Whether the detached supervisor still runs: True/False on its host, None if unknowable here."""
        if self.mode != PROCESS or self.pid is None:
            return None
        if self.ended_at is not None:
            return False
        alive = owner_alive({"host": self.host, "pid": self.pid})
        return False if alive and _zombie(self.pid) else alive

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> LaunchRecord:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in doc.items() if k in known})


def from_spec(kind: str, spec: Any, run_id: str) -> LaunchRecord:
    """The record of a run of ``spec`` (a pipeline, train job or provision spec, validated) as ``launch``
    starts it: where its state lives, its zones, hosts, shape and timing."""
    provision = spec if kind == PROVISION else spec.provision
    t = None if kind == PROVISION else spec.train
    return LaunchRecord(
        run_id,
        kind,
        PROCESS,
        checkpoint_dir=str(t.checkpoint_dir) if t else "",
        checkpoint_subdir=t.checkpoint_subdir if t else "",
        zones=list(provision.slice.zones),
        hosts=provision.slice.accelerator.hosts,
        accelerator=provision.slice.accelerator.name,
        slices=provision.slice.slices,
        heartbeat_s=t.heartbeat_interval.total_seconds() if t else 0.0,
        max_duration_s=t.max_duration.total_seconds() if t else provision.overall_timeout.total_seconds(),
    )


def _zombie(pid: int) -> bool:
    """True if ``pid`` has exited and waits for its parent to reap it (Linux; False elsewhere)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[:1] == ["Z"]


def launch_dir(settings: Settings, run_id: str) -> Path:
    """``<state_dir>/launches/<run_id>``."""
    return Path(settings.state_dir) / "launches" / check_run_id(run_id)


def save(settings: Settings, record: LaunchRecord) -> Path:
    """Write ``record`` atomically (readers never see half a file); its path."""
    where = launch_dir(settings, record.run_id)
    where.mkdir(parents=True, exist_ok=True)
    path = where / "launch.json"
    tmp = path.with_name(f"launch.json.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(record.to_json(), indent=2, sort_keys=True), encoding="utf-8")
    os.replace(tmp, path)
    return path


def load(settings: Settings, run_id: str) -> LaunchRecord | None:
    """The record of ``run_id``, or None if it was not launched with this state directory."""
    path = launch_dir(settings, run_id) / "launch.json"
    try:
        return LaunchRecord.from_json(json.loads(path.read_text(encoding="utf-8")))
    except FileNotFoundError:
        return None


def every(settings: Settings) -> list[LaunchRecord]:
    """Every launched run in the state directory, newest first."""
    root = Path(settings.state_dir) / "launches"
    out = []
    for path in sorted(root.glob("*/launch.json")):
        try:
            out.append(LaunchRecord.from_json(json.loads(path.read_text(encoding="utf-8"))))
        except (OSError, ValueError, TypeError):
            continue  # a record being replaced, or not ours
    return sorted(out, key=lambda r: r.launched_at, reverse=True)


def update(settings: Settings, run_id: str, **changes: Any) -> LaunchRecord | None:
    """Change some fields of a run's record, under a lock (the supervisor and ``cancel`` may both write)."""
    where = launch_dir(settings, run_id)
    if not where.is_dir():
        return None
    with (where / ".lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        record = load(settings, run_id)
        if record is None:
            return None
        for k, v in changes.items():
            setattr(record, k, v)
        save(settings, record)
        return record
