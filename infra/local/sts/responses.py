"""HTTP layer of the fake STS: parse requests, call ``StsBackend``, render Google-style JSON.

No state lives here. The Python client sends ``$alt=json;enum-encoding=int`` and integer enums
in bodies; both encodings are accepted, and responses use the one asked for, as Google does.
"""

from __future__ import annotations

import json
from typing import Any

from werkzeug.wrappers import Request

from infra.local.core import exceptions as exc
from infra.local.core.responses import JsonApp
from infra.local.sts import urls
from infra.local.sts.models import StsBackend

# Integer values of the enums (google.storagetransfer.v1 protos; errorCode is google.rpc.Code).
JOB_STATUS = {"STATUS_UNSPECIFIED": 0, "ENABLED": 1, "DISABLED": 2, "DELETED": 3}
OP_STATUS = {"STATUS_UNSPECIFIED": 0, "IN_PROGRESS": 1, "PAUSED": 2, "SUCCESS": 3, "FAILED": 4, "ABORTED": 5,
             "QUEUED": 6, "SUSPENDING": 7}  # fmt: skip
OVERWRITE_WHEN = {"OVERWRITE_WHEN_UNSPECIFIED": 0, "DIFFERENT": 1, "NEVER": 2, "ALWAYS": 3}
ERROR_CODE = {"OK": 0, **{name: code for name, (code, _) in exc.CODES.items()}}
ENUMS = {"job_status": JOB_STATUS, "op_status": OP_STATUS, "overwrite_when": OVERWRITE_WHEN, "error_code": ERROR_CODE}


def _conv(table: dict[str, int], value: Any, to_int: bool) -> Any:
    if to_int:
        return table.get(value, value) if isinstance(value, str) else value
    back = {v: k for k, v in table.items()}
    return back.get(value, value) if isinstance(value, int) else value


def _spec(spec: Any, to_int: bool) -> Any:
    if not isinstance(spec, dict) or not isinstance(spec.get("transferOptions"), dict):
        return spec
    opts = dict(spec["transferOptions"])
    if "overwriteWhen" in opts:
        opts["overwriteWhen"] = _conv(OVERWRITE_WHEN, opts["overwriteWhen"], to_int)
    return {**spec, "transferOptions": opts}


def job_enums(job: dict[str, Any], to_int: bool) -> dict[str, Any]:
    """A TransferJob with its enums as integers (``to_int``) or names."""
    out = dict(job)
    if "status" in out:
        out["status"] = _conv(JOB_STATUS, out["status"], to_int)
    if "transferSpec" in out:
        out["transferSpec"] = _spec(out["transferSpec"], to_int)
    return out


def op_enums(op: dict[str, Any], to_int: bool) -> dict[str, Any]:
    """An Operation whose TransferOperation metadata has its enums as integers or names."""
    meta = dict(op["metadata"])
    meta["status"] = _conv(OP_STATUS, meta["status"], to_int)
    meta["transferSpec"] = _spec(meta.get("transferSpec"), to_int)
    if "errorBreakdowns" in meta:
        meta["errorBreakdowns"] = [
            {**e, "errorCode": _conv(ERROR_CODE, e["errorCode"], to_int)} for e in meta["errorBreakdowns"]
        ]
    return {**op, "metadata": meta}


class StsResponses(JsonApp):
    """A WSGI application serving ``backend`` with Google's URL scheme and JSON."""

    routes = urls.ROUTES

    def __init__(self, backend: StsBackend) -> None:
        self.backend = backend

    def dispatch(self, req: Request, handler: str, args: dict[str, str]) -> Any:
        ints = "enum-encoding=int" in req.args.get("$alt", "")
        return getattr(self, handler)(req, ints, **args)

    @staticmethod
    def _filter(req: Request) -> dict[str, Any]:
        try:
            flt = json.loads(req.args.get("filter") or "{}")
        except ValueError as e:
            raise exc.InvalidArgument(f"filter is not JSON: {e}") from e
        if not isinstance(flt, dict):
            raise exc.InvalidArgument("filter must be a JSON object")
        return flt

    # -- transfer jobs -----------------------------------------------------------------------
    def create_transfer_job(self, req: Request, ints: bool) -> dict[str, Any]:
        return job_enums(self.backend.create_job(job_enums(self._body(req), False)), ints)

    def list_transfer_jobs(self, req: Request, ints: bool) -> dict[str, Any]:
        out = self.backend.list_jobs(self._filter(req))
        if "transferJobs" in out:
            out["transferJobs"] = [job_enums(j, ints) for j in out["transferJobs"]]
        return out

    def get_transfer_job(self, req: Request, ints: bool, name: str) -> dict[str, Any]:
        return job_enums(self.backend.get_job(name, req.args.get("projectId")), ints)

    def update_transfer_job(self, req: Request, ints: bool, name: str) -> dict[str, Any]:
        body = self._body(req)
        body["transferJob"] = job_enums(body.get("transferJob") or {}, False)
        return job_enums(self.backend.update_job(name, body), ints)

    def delete_transfer_job(self, req: Request, ints: bool, name: str) -> dict[str, Any]:
        self.backend.delete_job(name, req.args.get("projectId"))
        return {}

    def run_transfer_job(self, req: Request, ints: bool, name: str) -> dict[str, Any]:
        return op_enums(self.backend.run_job(name, self._body(req).get("projectId")), ints)

    # -- operations --------------------------------------------------------------------------
    def list_operations(self, req: Request, ints: bool) -> dict[str, Any]:
        flt = self._filter(req)
        if "transferStatuses" in flt:
            flt["transferStatuses"] = [_conv(OP_STATUS, s, False) for s in flt["transferStatuses"]]
        out = self.backend.list_operations(
            flt, int(req.args.get("pageSize") or 0), req.args.get("pageToken") or ""
        )  # fmt: skip
        if "operations" in out:
            out["operations"] = [op_enums(o, ints) for o in out["operations"]]
        return out

    def get_operation(self, req: Request, ints: bool, name: str) -> dict[str, Any]:
        return op_enums(self.backend.get_operation(name), ints)

    def operation_verb(self, req: Request, ints: bool, name: str, verb: str) -> dict[str, Any]:
        if verb == "cancel":
            return self.backend.cancel_operation(name)
        return self.backend.set_paused(name, verb == "pause")

    def get_google_service_account(self, req: Request, ints: bool, project: str) -> dict[str, Any]:
        return {"accountEmail": f"project-{project}@storage-transfer-service.iam.gserviceaccount.com",
                "subjectId": "100000000000000000001"}  # fmt: skip

    # -- controls ----------------------------------------------------------------------------
    def fake_reset(self, req: Request, ints: bool) -> dict[str, Any]:
        self.backend.reset()
        return {}

    def fake_fail(self, req: Request, ints: bool) -> dict[str, Any]:
        """``{"object": "s3://bucket/key" | "key", "code": "PERMISSION_DENIED", "message": ...}``."""
        body = self._body(req)
        if not body.get("object"):
            raise exc.InvalidArgument("object is required")
        self.backend.fail_object(str(body["object"]), str(body.get("code", "UNKNOWN")),
                                 str(body.get("message", "injected failure")))  # fmt: skip
        return {}

    def fake_deny(self, req: Request, ints: bool) -> dict[str, Any]:
        """``{"bucket": "name"}``: reading that S3 bucket is PERMISSION_DENIED."""
        bucket = self._body(req).get("bucket")
        if not bucket:
            raise exc.InvalidArgument("bucket is required")
        self.backend.deny_bucket(str(bucket))
        return {}

    def fake_stall(self, req: Request, ints: bool) -> dict[str, Any]:
        """``{"on": true}`` holds every copy worker before its next object; ``{"on": false}`` lets go."""
        self.backend.stall(bool(self._body(req).get("on", True)))
        return {}

    def fake_state(self, req: Request, ints: bool) -> dict[str, Any]:
        return self.backend.state()
