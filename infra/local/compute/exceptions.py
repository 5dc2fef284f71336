"""Compute Engine's errors: HTTP errors with ``errors: [{reason, domain, message}]`` (on the core's
error model), and the ``Operation.error`` bodies a failed insert ends with."""

from __future__ import annotations

from typing import Any

from infra.local.core import exceptions as exc


class Invalid(exc.InvalidArgument):
    """400 with reason ``invalid`` (Compute Engine's "Invalid value for field ...")."""

    def __init__(self, message: str) -> None:
        super().__init__(message, reason="invalid")


def not_found(path: str) -> exc.ApiError:
    return exc.NotFound(f"The resource '{path}' was not found", reason="notFound")


def already_exists(path: str) -> exc.ApiError:
    return exc.AlreadyExists(f"The resource '{path}' already exists", reason="alreadyExists")


def in_use(what: str, path: str, user: str) -> exc.ApiError:
    return exc.FailedPrecondition(
        f"The {what} resource '{path}' is already being used by '{user}'", reason="resourceInUseByAnotherResource"
    )


def zone_exhausted(project: str, zone: str, machine_type: str, model: str) -> dict[str, Any]:
    """The ``error`` of an insert operation when the zone has no capacity for it (a stock-out)."""
    return {"errors": [{
        "code": "ZONE_RESOURCE_POOL_EXHAUSTED",
        "message": f"The zone 'projects/{project}/zones/{zone}' does not have enough resources available to "
                   "fulfill the request.  Try a different zone, or try again later.",
        "errorDetails": [
            {"errorInfo": {"reason": "resource_availability", "domain": "compute.googleapis.com",
                           "metadatas": {"zone": zone, "vmType": machine_type, "provisioningModel": model,
                                         "attachment": "", "zonesAvailable": ""}}},
            {"help": {"links": [{"description": "Troubleshooting documentation",
                                 "url": "https://cloud.google.com/compute/docs/resource-error"}]}},
            {"localizedMessage": {"locale": "en-US", "message": f"A {machine_type} VM instance ({model}) is "
                                  f"currently unavailable in the {zone} zone."}},
        ],
    }]}  # fmt: skip


def quota_exceeded(metric: str, limit: int, region: str) -> dict[str, Any]:
    """The ``error`` of an insert operation that would exceed a regional quota."""
    msg = f"Quota '{metric}' exceeded.  Limit: {limit:.1f} in region {region}."
    info = {"metricName": f"compute.googleapis.com/{metric.lower()}", "limitName": metric, "limit": limit,
            "dimensions": {"region": region}}  # fmt: skip
    return {"errors": [{"code": "QUOTA_EXCEEDED", "message": msg, "errorDetails": [{"quotaInfo": info}]}]}


# The HTTP status an operation's error carries beside ``error`` (``httpErrorStatusCode`` /
# ``httpErrorMessage``): what the same error would have been as a synchronous answer.
HTTP_OF: dict[str, tuple[int, str]] = {
    "ZONE_RESOURCE_POOL_EXHAUSTED": (503, "SERVICE UNAVAILABLE"),
    "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS": (503, "SERVICE UNAVAILABLE"),
    "QUOTA_EXCEEDED": (403, "FORBIDDEN"),
    "RESOURCE_NOT_FOUND": (404, "NOT FOUND"),
    "INTERNAL_ERROR": (500, "INTERNAL SERVER ERROR"),
}
ASYNC_ERRORS = ("ZONE_RESOURCE_POOL_EXHAUSTED", "QUOTA_EXCEEDED", "INTERNAL_ERROR")


def http_of(error: dict[str, Any]) -> tuple[int, str]:
    """``(httpErrorStatusCode, httpErrorMessage)`` of an operation ``error`` body."""
    code = str(((error.get("errors") or [{}])[0]).get("code") or "")
    return HTTP_OF.get(code, (400, "BAD REQUEST"))


def async_error(code: str, project: str, zone: str, region: str) -> dict[str, Any]:
    """The ``error`` body of an operation made to fail by the fake's control (``ASYNC_ERRORS``)."""
    if code == "ZONE_RESOURCE_POOL_EXHAUSTED":
        return zone_exhausted(project, zone or region, "", "")
    if code == "QUOTA_EXCEEDED":
        return quota_exceeded("TPU_PODSLICE_V5P", 0, region)
    if code == "INTERNAL_ERROR":
        return {"errors": [{"code": "INTERNAL_ERROR", "message": "Internal error. Please try again or contact "
                            "Google Support. (Code: 'fake-0000')"}]}  # fmt: skip
    raise exc.InvalidArgument(f"error: {code!r} is not one of {list(ASYNC_ERRORS)}")
