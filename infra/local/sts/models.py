"""The fake Storage Transfer Service's state: transfer jobs and operations, usable without HTTP.

Every public method mirrors one REST method (JSON in, JSON out, enum *names*). A run starts an
operation driven by a background thread: it reads the transfer manifest (a CSV object in GCS:
one object name per row, relative to the source path) or lists the source, then copies the
objects on a shared pool of ``parallel`` threads, updating the operation's counters as it goes.

Operation status: QUEUED -> IN_PROGRESS -> SUCCESS | FAILED (any object failed, or the source
was not readable) | ABORTED (cancelled); PAUSED while paused. Controls for tests: ``fail_object``
(that object fails with a code), ``deny_bucket`` (reading the bucket is PERMISSION_DENIED),
``stall`` (workers hold before each object until un-stalled), ``reset``.
"""

from __future__ import annotations

import base64
import csv
import io
import re
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from typing import Any

from infra.local.core import exceptions as exc
from infra.local.sts.mover import Mover, SourceError, SourceObject

OP_TYPE = "type.googleapis.com/google.storagetransfer.v1.TransferOperation"
EMPTY_TYPE = "type.googleapis.com/google.protobuf.Empty"
JOB_STATUSES = ("ENABLED", "DISABLED", "DELETED")
_JOB_NAME = re.compile(r"^transferJobs/[A-Za-z0-9_-]{1,120}[A-Za-z0-9]$")
_ROLE_ARN = re.compile(r"^arn:aws:iam::[0-9]{12}:role/[\w+=,.@/-]{1,512}$")
_MUTABLE = {"description", "transferSpec", "status", "schedule", "notificationConfig", "loggingConfig",
            "eventStream", "serviceAccount", "replicationSpec"}  # fmt: skip
COUNTERS = ("objectsFoundFromSource", "bytesFoundFromSource", "objectsCopiedToSink", "bytesCopiedToSink",
            "objectsFromSourceSkippedBySync", "bytesFromSourceSkippedBySync", "objectsFromSourceFailed",
            "bytesFromSourceFailed")  # fmt: skip


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class Operation:
    """One run of a transfer job (a ``TransferOperation`` inside a long-running ``Operation``)."""

    name: str
    project_id: str
    job_name: str
    spec: dict[str, Any]
    status: str = "QUEUED"
    start: str = field(default_factory=now_rfc3339)
    end: str | None = None
    counters: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTERS, 0))
    errors: dict[str, list[tuple[str, str]]] = field(default_factory=dict)  # code -> [(url, detail)]
    resumed: threading.Event = field(default_factory=threading.Event)

    def fail(self, code: str, url: str, detail: str) -> None:
        self.errors.setdefault(code, []).append((url, detail))

    def to_json(self) -> dict[str, Any]:
        meta: dict[str, Any] = {
            "@type": OP_TYPE,
            "name": self.name,
            "projectId": self.project_id,
            "transferSpec": _public_spec(self.spec),
            "startTime": self.start,
            "status": self.status,
            "counters": {k: str(v) for k, v in self.counters.items() if v},
            "transferJobName": self.job_name,
        }
        if self.errors:
            meta["errorBreakdowns"] = [
                {"errorCode": code, "errorCount": str(len(entries)),
                 "errorLogEntries": [{"url": u, "errorDetails": [d]} for u, d in entries[:5]]}
                for code, entries in sorted(self.errors.items())
            ]  # fmt: skip
        if self.end:
            meta["endTime"] = self.end
        out: dict[str, Any] = {"name": self.name, "metadata": meta, "done": self.end is not None}
        if self.status == "SUCCESS":
            out["response"] = {"@type": EMPTY_TYPE}
        elif self.end is not None:
            code = next(iter(sorted(self.errors)), "ABORTED" if self.status == "ABORTED" else "UNKNOWN")
            out["error"] = {"code": exc.CODES.get(code, (2, 500))[0], "message": f"transfer operation {self.status}"}
        return out


def _public_spec(spec: dict[str, Any]) -> dict[str, Any]:
    """The spec as STS returns it: never the secret access key."""
    src = spec.get("awsS3DataSource")
    if not src or "awsAccessKey" not in src:
        return spec
    key = {k: v for k, v in src["awsAccessKey"].items() if k != "secretAccessKey"}
    return {**spec, "awsS3DataSource": {**src, "awsAccessKey": key}}


@dataclass
class Job:
    body: dict[str, Any]

    @property
    def name(self) -> str:
        return str(self.body["name"])

    def to_json(self) -> dict[str, Any]:
        out = dict(self.body)
        if "transferSpec" in out:
            out["transferSpec"] = _public_spec(out["transferSpec"])
        return out


class StsBackend:
    """All projects of the fake service. Thread-safe; see the module docstring."""

    def __init__(self, mover: Mover | None = None, parallel: int = 8) -> None:
        self.mover = mover
        self._lock = threading.RLock()
        self._pool = ThreadPoolExecutor(parallel, thread_name_prefix="fake-sts-copy")
        self._unstalled = threading.Event()
        self.reset()

    # -- controls ----------------------------------------------------------------------------
    def reset(self) -> None:
        with self._lock:
            self.jobs: dict[str, Job] = {}
            self.ops: dict[str, Operation] = {}
            self.failing: dict[str, tuple[str, str]] = {}  # object url or key -> (code, message)
            self.denied: set[str] = set()
            self._seq = 0
            self._unstalled.set()

    def fail_object(self, obj: str, code: str = "UNKNOWN", message: str = "injected failure") -> None:
        """Make copying ``obj`` (``s3://bucket/key`` or a key) fail with ``code``."""
        if code not in exc.CODES:
            raise exc.InvalidArgument(f"code {code!r} is not a canonical status: {sorted(exc.CODES)}")
        with self._lock:
            self.failing[obj] = (code, message)

    def deny_bucket(self, bucket: str) -> None:
        """Reading this S3 bucket is PERMISSION_DENIED (as with a role that lacks s3:GetObject)."""
        with self._lock:
            self.denied.add(bucket)

    def stall(self, on: bool) -> None:
        """Hold every worker before its next object (``on``) or let them go."""
        (self._unstalled.clear if on else self._unstalled.set)()

    def state(self) -> dict[str, Any]:
        with self._lock:
            return {
                "jobs": len(self.jobs),
                "operations": {n: o.status for n, o in self.ops.items()},
                "stalled": not self._unstalled.is_set(),
            }

    def wait_done(self, name: str, timeout: float = 30.0) -> dict[str, Any]:
        """Wait for an operation to finish (for tests); returns its JSON."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            op = self.get_operation(name)
            if op["done"]:
                return op
            time.sleep(0.01)
        raise TimeoutError(f"operation {name} not done after {timeout}s")

    # -- transfer jobs -----------------------------------------------------------------------
    def create_job(self, body: dict[str, Any]) -> dict[str, Any]:
        project = body.get("projectId")
        if not project:
            raise exc.InvalidArgument("projectId is required")
        self._check_spec(body.get("transferSpec"))
        status = body.get("status") or "ENABLED"
        if status not in ("ENABLED", "DISABLED"):
            raise exc.InvalidArgument(f"status must be ENABLED or DISABLED at creation, not {status}")
        with self._lock:
            self._seq += 1
            name = body.get("name") or f"transferJobs/{int(time.time() * 1000)}{self._seq:06d}"
            if not _JOB_NAME.match(name):
                raise exc.InvalidArgument(f"job name {name!r} must be transferJobs/<letters, digits, _ or ->")
            if name in self.jobs:
                raise exc.AlreadyExists(f"transfer job {name} already exists")
            stamp = now_rfc3339()
            job = Job({**body, "name": name, "status": status, "creationTime": stamp, "lastModificationTime": stamp})
            self.jobs[name] = job
            return job.to_json()

    def _check_spec(self, spec: Any) -> None:
        if not isinstance(spec, dict):
            raise exc.InvalidArgument("transferSpec is required")
        src, sink = spec.get("awsS3DataSource"), spec.get("gcsDataSink")
        if not src or not sink:
            raise exc.InvalidArgument("this fake supports awsS3DataSource -> gcsDataSink transfers only")
        if not src.get("bucketName") or not sink.get("bucketName"):
            raise exc.InvalidArgument("bucketName is required for the source and the sink")
        for what, path in (("awsS3DataSource", src.get("path", "")), ("gcsDataSink", sink.get("path", ""))):
            if path and (not path.endswith("/") or path.startswith("/")):
                raise exc.InvalidArgument(f"{what}.path {path!r} must end with '/' and not start with it")
        role, key = src.get("roleArn"), src.get("awsAccessKey")
        if bool(role) == bool(key):
            raise exc.InvalidArgument("awsS3DataSource needs exactly one of roleArn or awsAccessKey")
        if role and not _ROLE_ARN.match(role):
            raise exc.InvalidArgument(f"roleArn {role!r} is not an IAM role ARN")
        if key and not (key.get("accessKeyId") and key.get("secretAccessKey")):
            raise exc.InvalidArgument("awsAccessKey needs accessKeyId and secretAccessKey")
        manifest = (spec.get("transferManifest") or {}).get("location")
        if manifest is not None and not str(manifest).startswith("gs://"):
            raise exc.InvalidArgument(f"transferManifest.location {manifest!r} must be a gs:// object")

    def _job(self, name: str, project_id: str | None) -> Job:
        job = self.jobs.get(name)
        if job is None or job.body.get("status") == "DELETED":
            raise exc.NotFound(f"transfer job {name} not found")
        if project_id and job.body.get("projectId") != project_id:
            raise exc.NotFound(f"transfer job {name} not found in project {project_id}")
        return job

    def get_job(self, name: str, project_id: str | None) -> dict[str, Any]:
        with self._lock:
            return self._job(name, project_id).to_json()

    def list_jobs(self, flt: dict[str, Any]) -> dict[str, Any]:
        names, statuses = set(flt.get("jobNames") or ()), set(flt.get("jobStatuses") or ())
        with self._lock:
            jobs = [
                j.to_json()
                for j in self.jobs.values()
                if j.body.get("projectId") == flt.get("projectId")
                and (not names or j.name in names)
                and (j.body["status"] in statuses if statuses else j.body["status"] != "DELETED")
            ]
        return {"transferJobs": jobs} if jobs else {}

    def update_job(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        mask = [m.strip() for m in str(body.get("updateTransferJobFieldMask") or "").split(",") if m.strip()]
        bad = [m for m in mask if m not in _MUTABLE]
        if not mask or bad:
            raise exc.InvalidArgument(f"updateTransferJobFieldMask must name fields among {sorted(_MUTABLE)}")
        patch = body.get("transferJob") or {}
        with self._lock:
            job = self._job(name, body.get("projectId"))
            for m in mask:
                if m == "transferSpec":
                    self._check_spec(patch.get(m))
                if m == "status" and patch.get(m) not in JOB_STATUSES:
                    raise exc.InvalidArgument(f"status must be one of {JOB_STATUSES}")
                if m in patch:
                    job.body[m] = patch[m]
                else:
                    job.body.pop(m, None)
            job.body["lastModificationTime"] = now_rfc3339()
            if job.body["status"] == "DELETED":
                job.body["deletionTime"] = job.body["lastModificationTime"]
            return job.to_json()

    def delete_job(self, name: str, project_id: str | None) -> dict[str, Any]:
        return self.update_job(name, {"projectId": project_id, "transferJob": {"status": "DELETED"},
                                      "updateTransferJobFieldMask": "status"})  # fmt: skip

    def run_job(self, name: str, project_id: str | None) -> dict[str, Any]:
        with self._lock:
            job = self._job(name, project_id)
            if job.body["status"] != "ENABLED":
                raise exc.FailedPrecondition(f"transfer job {name} is {job.body['status']}, not ENABLED")
            if any(o.job_name == name and o.end is None for o in self.ops.values()):
                raise exc.FailedPrecondition(f"transfer job {name} already has an operation in progress")
            self._seq += 1
            op_name = f"transferOperations/transferJobs-{name.split('/', 1)[1]}-{self._seq}"
            op = Operation(op_name, str(job.body["projectId"]), name, job.body["transferSpec"])
            op.resumed.set()
            self.ops[op_name] = op
            job.body["latestOperationName"] = op_name
            out = op.to_json()
        threading.Thread(target=self._drive, args=(op,), name=f"fake-sts-{self._seq}", daemon=True).start()
        return out

    # -- operations --------------------------------------------------------------------------
    def _op(self, name: str) -> Operation:
        op = self.ops.get(name)
        if op is None:
            raise exc.NotFound(f"transfer operation {name} not found")
        return op

    def get_operation(self, name: str) -> dict[str, Any]:
        with self._lock:
            return self._op(name).to_json()

    def list_operations(self, flt: dict[str, Any], page_size: int = 0, page_token: str = "") -> dict[str, Any]:
        if not flt.get("projectId"):
            raise exc.InvalidArgument("filter must name projectId")
        jobs, names = set(flt.get("jobNames") or ()), set(flt.get("operationNames") or ())
        statuses = set(flt.get("transferStatuses") or ())
        with self._lock:
            ops = [
                o.to_json()
                for o in self.ops.values()
                if o.project_id == flt["projectId"]
                and (not jobs or o.job_name in jobs)
                and (not names or o.name in names)
                and (not statuses or o.status in statuses)
            ]
        start = int(page_token or 0)
        size = page_size or 256
        out: dict[str, Any] = {"operations": ops[start : start + size]} if ops else {}
        if start + size < len(ops):
            out["nextPageToken"] = str(start + size)
        return out

    def set_paused(self, name: str, paused: bool) -> dict[str, Any]:
        with self._lock:
            op = self._op(name)
            if op.end is not None:
                raise exc.FailedPrecondition(f"transfer operation {name} is {op.status}")
            op.status = "PAUSED" if paused else "IN_PROGRESS"
            (op.resumed.clear if paused else op.resumed.set)()
        return {}

    def cancel_operation(self, name: str) -> dict[str, Any]:
        with self._lock:
            op = self._op(name)
            if op.end is None:
                op.status, op.end = "ABORTED", now_rfc3339()
                op.resumed.set()
        return {}

    # -- the transfer itself -----------------------------------------------------------------
    def _drive(self, op: Operation) -> None:
        spec = op.spec
        src = spec["awsS3DataSource"]
        creds = src.get("awsAccessKey") or {"roleArn": src.get("roleArn")}
        with self._lock:
            if op.status == "QUEUED":
                op.status = "IN_PROGRESS"
        try:
            objects = self._objects(op, creds)
        except SourceError as e:
            where = f"s3://{src['bucketName']}/{src.get('path', '')}"
            self._finish(op, partial(op.fail, e.code, where, str(e)))
            return
        with self._lock:
            op.counters["objectsFoundFromSource"] = len(objects)
            op.counters["bytesFoundFromSource"] = sum(o.size for o in objects)
        futures = [self._pool.submit(self._copy_one, op, creds, o) for o in objects]
        for f in futures:
            f.result()
        self._finish(op, lambda: None)

    def _finish(self, op: Operation, record: Callable[[], None]) -> None:
        with self._lock:
            record()
            if op.end is None:
                op.status = "FAILED" if op.errors else "SUCCESS"
                op.end = now_rfc3339()

    def _objects(self, op: Operation, creds: dict[str, Any]) -> list[SourceObject]:
        """The objects to transfer: the manifest's rows (checked to exist), or a listing."""
        assert self.mover is not None, "the fake has no mover: it cannot transfer data"
        src = op.spec["awsS3DataSource"]
        bucket, path = src["bucketName"], src.get("path", "")
        if bucket in self.denied:
            raise SourceError("PERMISSION_DENIED", f"Access Denied: cannot read the AWS S3 bucket {bucket!r}")
        location = (op.spec.get("transferManifest") or {}).get("location")
        if not location:
            return self.mover.list_s3(creds, bucket, path)
        mbucket, _, mname = str(location)[len("gs://") :].partition("/")
        rows = csv.reader(io.StringIO(self.mover.read_gcs(mbucket, mname).decode("utf-8")))
        out = []
        for row in rows:
            if row and row[0]:
                try:
                    out.append(self.mover.head_s3(creds, bucket, path + row[0]))
                except SourceError as e:
                    op.fail(e.code, f"s3://{bucket}/{path}{row[0]}", str(e))
        return out

    def _copy_one(self, op: Operation, creds: dict[str, Any], obj: SourceObject) -> None:
        assert self.mover is not None
        self._unstalled.wait()
        op.resumed.wait()
        if op.end is not None:  # cancelled
            return
        src, sink = op.spec["awsS3DataSource"], op.spec["gcsDataSink"]
        url = f"s3://{src['bucketName']}/{obj.key}"
        rel = obj.key[len(src.get("path", "")) :]
        injected = self.failing.get(url) or self.failing.get(obj.key) or self.failing.get(rel)
        try:
            if injected:
                raise SourceError(*injected)
            dest = sink.get("path", "") + rel
            if self._skip(op, sink["bucketName"], dest, obj):
                with self._lock:
                    op.counters["objectsFromSourceSkippedBySync"] += 1
                    op.counters["bytesFromSourceSkippedBySync"] += obj.size
                return
            data = self.mover.read_s3(creds, src["bucketName"], obj.key)
            self.mover.write_gcs(sink["bucketName"], dest, data)
        except SourceError as e:
            with self._lock:
                op.fail(e.code, url, str(e))
                op.counters["objectsFromSourceFailed"] += 1
                op.counters["bytesFromSourceFailed"] += obj.size
            return
        with self._lock:
            op.counters["objectsCopiedToSink"] += 1
            op.counters["bytesCopiedToSink"] += len(data)

    def _skip(self, op: Operation, bucket: str, name: str, obj: SourceObject) -> bool:
        """``overwriteWhen``: ALWAYS copies; NEVER skips an existing object; DIFFERENT (default)
        skips one with the same size and, for a single-part source, the same MD5 (its ETag)."""
        opts = op.spec.get("transferOptions") or {}
        when = opts.get("overwriteWhen") or ("ALWAYS" if opts.get("overwriteObjectsAlreadyExistingInSink") else "")
        if when == "ALWAYS":
            return False
        assert self.mover is not None
        existing = self.mover.gcs_md5(bucket, name)
        if existing is None:
            return False
        if when == "NEVER":
            return True
        size, md5_b64 = existing
        if "-" in obj.etag:
            return size == obj.size
        return size == obj.size and md5_b64 == base64.b64encode(bytes.fromhex(obj.etag)).decode()
