"""The agent's part of goodput accounting (stdlib only, Python 3.10): the trainer's own step records.

A trainer may append one JSON line per event to the file named by ``TPU_OPS_STEP_LOG``:
``{"kind": "step"|"save"|"restore"|"data"|"prep", "step": N, "start": t0, "end": t1}`` (wall-clock
seconds). Worker 0's agent reads the new lines at every heartbeat and carries them all, as
``timeline: [[kind, step, start, end], ...]`` (the newest ``HEARTBEAT_RECORDS``), in its heartbeat (a
field added beside the others); the supervisor merges them into the run's state and derives productive
time from them.

A ``step`` line may also say what one step does across the whole slice: ``"tokens"`` (tokens it
trains on) and ``"flops"`` (model FLOPs: forward and backward, without rematerialisation, e.g.
6 * parameters * tokens for a transformer). Worker 0's agent carries the newest figures as the
heartbeat fields ``tokens_per_step`` and ``model_flops_per_step`` (``job.WORK_FIELDS``); the run
summary turns them into dollars per million tokens and MFU. MaxText's metrics carry both, per
device: ``perf/per_device_tokens`` and ``perf/per_device_tflops`` * 1e12, times the device count.
"""

from __future__ import annotations

import ipaddress
import json
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tpu_ops.agent.job import WORK_FIELDS

STEP_LOG_ENV = "TPU_OPS_STEP_LOG"
KINDS = frozenset({"step", "save", "restore", "data", "prep", "init"})
MAX_RECORDS = 1_000_000  # kept in memory (the Cloud Logging writer reads them all)
HEARTBEAT_RECORDS = 5_000  # the newest ones ride in each heartbeat (~250 kB); the supervisor merges them


class StepTimeline:
    """Incrementally reads a trainer's step log; worker 0's records go into its heartbeats."""

    def __init__(self, workdir: Path, worker: int) -> None:
        self.path = workdir / "steps.jsonl"
        self.worker = worker
        self.records: list[list[Any]] = []
        self.work: dict[str, float] = {}  # tokens_per_step, model_flops_per_step: the newest a step line gave
        self._offset = 0
        self._partial = b""
        self.path.unlink(missing_ok=True)  # a fresh incarnation on a reused disk starts a fresh log

    def env(self) -> dict[str, str]:
        """What the trainer's environment gets."""
        return {STEP_LOG_ENV: str(self.path)}

    def read(self) -> None:
        """Take the lines appended since the last read (a half-written last line waits)."""
        try:
            with self.path.open("rb") as f:
                f.seek(self._offset)
                chunk = f.read()
        except FileNotFoundError:
            return
        self._offset += len(chunk)
        data = self._partial + chunk
        *lines, self._partial = data.split(b"\n")
        for line in lines:
            try:
                r = json.loads(line)
                kind, start, end = str(r["kind"]), float(r["start"]), float(r["end"])
                step = None if r.get("step") is None else int(r["step"])
            except (ValueError, KeyError, TypeError):
                continue  # not ours to judge: a malformed line is skipped
            if kind in KINDS and end >= start and len(self.records) < MAX_RECORDS:
                self.records.append([kind, step, start, end])
            if kind == "step":
                self._work(r)

    def _work(self, r: dict[str, Any]) -> None:
        """The newest per-step figures a step line gives (positive finite numbers only)."""
        for key, name in (("tokens", WORK_FIELDS[0]), ("flops", WORK_FIELDS[1])):
            value = r.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < float("inf"):
                self.work[name] = float(value)

    def heartbeat_fields(self) -> dict[str, Any]:
        """Fields added to this worker's heartbeat (only worker 0 carries the timeline and the per-step figures)."""
        self.read()
        return {"timeline": self.records[-HEARTBEAT_RECORDS:], **self.work} if self.worker == 0 else {}


def record(
    path: Path | str | None, kind: str, step: int | None, start: float, end: float,
    tokens: float | None = None, flops: float | None = None,
) -> None:  # fmt: skip
    """For trainers: append one record to the step log at ``path`` (``TPU_OPS_STEP_LOG``; no-op without one);
    a step may say the tokens and model FLOPs it does across the slice."""
    if not path:
        return
    doc: dict[str, Any] = {"kind": kind, "step": step, "start": start, "end": end}
    doc.update({k: v for k, v in (("tokens", tokens), ("flops", flops)) if v is not None})
    line = json.dumps(doc) + "\n"
    with open(path, "a", encoding="utf-8") as f:
        f.write(line)


# -- Cloud Logging: the entries ml-goodput-measurement's GoodputRecorder writes ---------------------

DEFAULT_LOGGING_ENDPOINT = "https://logging.googleapis.com"
TOKEN_PATH = "instance/service-accounts/default/token"  # noqa: S105 - a metadata path, not a secret


def _is_loopback(url: str) -> bool:
    host = urllib.parse.urlsplit(url if "://" in url else f"http://{url}").hostname or ""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _rfc3339(t: float) -> str:
    utc = timezone.utc  # noqa: UP017 - the agent runs on Python 3.10 (no datetime.UTC)
    return datetime.fromtimestamp(t, tz=utc).isoformat().replace("+00:00", "Z")


class GoodputLogWriter:
    """Worker 0 writes the run's start-up and step entries to Cloud Logging, under the run's job name and
    with the payload fields ``GoodputRecorder`` uses, so Google's ``GoodputCalculator`` (and MaxText's goodput
    monitor) read tpu-ops runs. Checkpoint saves go in as custom badput events (``checkpoint_save``)."""

    def __init__(
        self,
        conf: dict[str, Any],
        incarnation: int,
        metadata_get: Callable[[str], str],
        endpoint: str | None = None,
        dry_run: bool = False,
        started_at: float | None = None,
    ) -> None:
        self.job_name, self.log_name = str(conf["job_name"]), str(conf["logger_name"])
        self.project, self.steps = str(conf["project"]), int(conf.get("steps") or 0)
        self.endpoint = endpoint or DEFAULT_LOGGING_ENDPOINT  # the setting logging_endpoint (TPU_OPS_LOGGING_ENDPOINT)
        if not self.endpoint.startswith(("http://", "https://")) or (dry_run and not _is_loopback(self.endpoint)):
            raise ValueError(f"logging endpoint {self.endpoint!r}: not an http(s) address on loopback (dry run)")
        self.metadata_get = metadata_get
        self.pending: list[tuple[float, dict[str, Any]]] = []
        self.sent = 0  # records of the timeline already turned into entries
        self.ended = False
        # A restart records the step it resumes from again (MaxText does): Google's calculator sees a disruption
        # only as a repeated step count, also when the checkpoint was the step in hand (save on SIGTERM).
        self.restart = incarnation > 0
        now = time.time() if started_at is None else started_at
        if incarnation == 0:  # the run's start: the wall time Google's calculator measures begins here
            self._add(float(conf.get("run_started_at") or now), {"job_start_time": float(conf.get("run_started_at")
                                                                                        or now)})  # fmt: skip
        else:  # a restart: the library counts the gap since the last step as disruption
            self._add(float(conf.get("requested_at") or now), {"job_start_time": float(conf.get("requested_at")
                                                                                        or now)})  # fmt: skip
        self._add(float(conf.get("requested_at") or now), {"tpu_init_start_time": float(conf.get("requested_at")
                                                                                           or now)})  # fmt: skip
        self._add(now, {"tpu_init_end_time": now})

    def _add(self, t: float, fields: dict[str, Any]) -> None:
        self.pending.append((t, {"job_name": self.job_name, **fields}))

    def take(self, records: list[list[Any]], final: bool) -> None:
        """Turn new timeline records into entries; the job's end once the last step (and its save) is in."""
        save = "checkpoint_save"
        for kind, step, start, end in records[self.sent :]:
            if kind == "step":
                if self.restart:
                    self.restart = False
                    t = start - 0.001  # just before: the calculator reads entries in time order
                    self._add(t, {"step_count": int(step) - 1, "step_start_time": t})
                self._add(start, {"step_count": int(step), "step_start_time": start})
            elif kind == "save":
                self._add(start, {"custom_badput_event_type": save, "custom_badput_event_start_time": start})
                self._add(end, {"custom_badput_event_type": save, "custom_badput_event_end_time": end})
            elif kind == "data":
                self._add(start, {"data_loading_start_time": start})
                self._add(end, {"data_loading_end_time": end})
            elif kind == "prep":
                self._add(start, {"training_prep_start_time": start})
                self._add(end, {"training_prep_end_time": end})
        self.sent = len(records)
        last_step = max((int(r[1]) for r in records if r[0] == "step"), default=0)
        if final and not self.ended and records and self.steps and last_step >= self.steps:
            end = max(float(r[3]) for r in records)
            self._add(end, {"job_end_time": end})
            self.ended = True

    def flush(self) -> None:
        """Send what is pending (``entries.write``); on failure keep it for the next heartbeat."""
        if not self.pending:
            return
        body = {
            "logName": f"projects/{self.project}/logs/{urllib.parse.quote(self.log_name, safe='')}",
            "resource": {"type": "global"},
            "entries": [{"severity": "INFO", "timestamp": _rfc3339(t), "jsonPayload": p} for t, p in self.pending],
        }
        try:
            token = json.loads(self.metadata_get(TOKEN_PATH))["access_token"]
            req = urllib.request.Request(  # noqa: S310 - scheme checked in __init__
                f"{self.endpoint.rstrip('/')}/v2/entries:write", data=json.dumps(body).encode(), method="POST",
                headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"},
            )  # fmt: skip
            with urllib.request.urlopen(req, timeout=10) as resp:  # noqa: S310 - scheme checked in __init__
                resp.read()
        except Exception as exc:  # a missed write must not stop training; retried at the next heartbeat
            print(f"tpu-ops agent: goodput entries not written to Cloud Logging: {exc}", file=sys.stderr, flush=True)
            return
        self.pending.clear()


class GoodputHooks:
    """What ``agent.run`` calls: the trainer's step log (all workers) and, on worker 0 when the job asks for
    it, the Cloud Logging entries. ``conf`` is the job document's ``goodput`` section."""

    def __init__(
        self,
        workdir: Path,
        worker: int,
        conf: dict[str, Any],
        incarnation: str,
        metadata_get: Callable[[str], str],
        endpoint: str | None = None,
        dry_run: bool = False,
    ) -> None:
        self.timeline = StepTimeline(workdir, worker)
        self.writer: GoodputLogWriter | None = None
        if worker == 0 and conf.get("logging"):
            number = int(incarnation.split("-", 1)[0]) if incarnation.split("-", 1)[0].isdigit() else 0
            self.writer = GoodputLogWriter(conf, number, metadata_get, endpoint, dry_run)

    def env(self) -> dict[str, str]:
        return self.timeline.env()

    def heartbeat_fields(self, state: str = "running") -> dict[str, Any]:
        fields = self.timeline.heartbeat_fields()
        if self.writer is not None:
            self.writer.take(self.timeline.records, final=state == "exited")
            self.writer.flush()
        return fields
