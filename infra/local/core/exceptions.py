"""Errors of the fakes, in Google's error model (shared by every fake in infra/local).

Over HTTP each becomes ``{"error": {"code": <http>, "message": ..., "status": <CANONICAL>}}`` (plus
``errors: [{reason, domain, message}]`` where the API has them, as Compute Engine does); inside a
long-running operation it becomes ``Status{code: <grpc code>, message}`` (code 8 is what the
client turns into ``ResourceExhausted``).
"""

from __future__ import annotations

from typing import Any

# google.rpc.Code: canonical status name -> (gRPC code, HTTP status).
CODES: dict[str, tuple[int, int]] = {
    "CANCELLED": (1, 499),
    "UNKNOWN": (2, 500),
    "INVALID_ARGUMENT": (3, 400),
    "DEADLINE_EXCEEDED": (4, 504),
    "NOT_FOUND": (5, 404),
    "ALREADY_EXISTS": (6, 409),
    "PERMISSION_DENIED": (7, 403),
    "RESOURCE_EXHAUSTED": (8, 429),
    "FAILED_PRECONDITION": (9, 400),
    "ABORTED": (10, 409),
    "OUT_OF_RANGE": (11, 400),
    "UNIMPLEMENTED": (12, 501),
    "INTERNAL": (13, 500),
    "UNAVAILABLE": (14, 503),
    "DATA_LOSS": (15, 500),
    "UNAUTHENTICATED": (16, 401),
}
_BY_HTTP = {http: name for name, (_, http) in reversed(list(CODES.items()))}


def status_for_http(http: int) -> str:
    """Canonical status name Google uses for an HTTP status (503 -> UNAVAILABLE)."""
    return _BY_HTTP.get(http, "UNKNOWN" if http >= 500 else "FAILED_PRECONDITION")


class ApiError(Exception):
    """An API error; ``status`` is the canonical name, ``http`` and ``grpc_code`` follow from it.

    ``reason`` (e.g. ``notFound``) adds Compute Engine's ``errors: [{reason, domain, message}]``.
    """

    status = "UNKNOWN"

    def __init__(
        self, message: str, *, status: str | None = None, http: int | None = None, reason: str | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        if status:
            self.status = status
        self.grpc_code, default_http = CODES.get(self.status, (2, 500))
        self.http = http or default_http
        self.reason = reason

    def to_http_json(self) -> dict[str, Any]:
        err: dict[str, Any] = {"code": self.http, "message": self.message, "status": self.status}
        if self.reason:
            err["errors"] = [{"message": self.message, "domain": "global", "reason": self.reason}]
        return {"error": err}

    def to_status(self) -> dict[str, Any]:
        """As a ``google.rpc.Status`` (the ``error`` of an Operation)."""
        return {"code": self.grpc_code, "message": self.message}


class InvalidArgument(ApiError):
    status = "INVALID_ARGUMENT"


class NotFound(ApiError):
    status = "NOT_FOUND"


class AlreadyExists(ApiError):
    status = "ALREADY_EXISTS"


class FailedPrecondition(ApiError):
    status = "FAILED_PRECONDITION"


class ResourceExhausted(ApiError):
    status = "RESOURCE_EXHAUSTED"


class Unimplemented(ApiError):
    status = "UNIMPLEMENTED"


class Injected(ApiError):
    """A fault injected through the control API (e.g. 503 UNAVAILABLE, 429 RESOURCE_EXHAUSTED)."""

    def __init__(self, http: int, message: str | None = None) -> None:
        status = status_for_http(http)
        super().__init__(message or f"injected fault: {status}", status=status, http=http)
