"""Translate SDK errors (google.api_core, botocore) into the tpu-ops hierarchy, in one place."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from tpu_ops.errors import (
    AccessDeniedError,
    AlreadyExistsError,
    CapacityError,
    CloudError,
    NotFoundError,
    QuotaError,
    TpuOpsError,
    TransientError,
)

TRANSIENT_STATUS = frozenset({408, 429, 500, 502, 503, 504})


def _by_status(status: int | None, message: str, service: str, request_id: str | None) -> CloudError:
    cls: type[CloudError] = CloudError
    if status in TRANSIENT_STATUS:
        cls = TransientError
    elif status == 404:
        cls = NotFoundError
    elif status == 409:
        cls = AlreadyExistsError
    elif status in (401, 403):
        cls = AccessDeniedError
    return cls(message, service=service, status=status, request_id=request_id)


def translate_google(exc: BaseException, service: str = "google", *, zone: str = "", tier: str = "") -> TpuOpsError:
    """Map a ``google.api_core`` / ``google.auth`` / transport exception to a ``TpuOpsError``."""
    from google.api_core import exceptions as gexc

    if isinstance(exc, TpuOpsError):
        return exc
    if isinstance(exc, gexc.ResourceExhausted) and "quota" in str(exc).lower():
        return QuotaError(str(exc), zone=zone, tier=tier, service=service, status=429)
    if isinstance(exc, gexc.ResourceExhausted) and zone:
        return CapacityError(str(exc), zone=zone, tier=tier, service=service, status=429)
    if isinstance(exc, gexc.GoogleAPICallError):
        return _by_status(exc.code, str(exc), service, None)
    if isinstance(exc, gexc.RetryError | TimeoutError | ConnectionError):
        return TransientError(f"{service}: {exc}", service=service)
    try:
        import requests

        if isinstance(exc, requests.ConnectionError | requests.Timeout):
            return TransientError(f"{service}: {exc}", service=service)
    except ImportError:  # pragma: no cover - requests ships with google-cloud-storage
        pass
    return CloudError(f"{service}: {type(exc).__name__}: {exc}", service=service)


def translate_boto(exc: BaseException, service: str = "aws") -> TpuOpsError:
    """Map a ``botocore`` exception to a ``TpuOpsError``."""
    from botocore import exceptions as bexc

    if isinstance(exc, TpuOpsError):
        return exc
    if isinstance(exc, bexc.ClientError):
        meta = exc.response.get("ResponseMetadata", {})
        status = meta.get("HTTPStatusCode")
        code = exc.response.get("Error", {}).get("Code", "")
        if code in ("NoSuchKey", "NoSuchBucket", "404", "ResourceNotFound", "NotFound"):
            status = 404
        if code in ("SlowDown", "Throttling", "ThrottlingException", "RequestTimeout"):
            status = 503
        return _by_status(status, str(exc), service, meta.get("RequestId"))
    if isinstance(exc, bexc.EndpointConnectionError | bexc.ConnectionClosedError | bexc.ReadTimeoutError):
        return TransientError(f"{service}: {exc}", service=service)
    if isinstance(exc, bexc.NoCredentialsError):
        return AccessDeniedError(f"{service}: {exc}", service=service)
    return CloudError(f"{service}: {type(exc).__name__}: {exc}", service=service)


@contextmanager
def google_errors(service: str, *, zone: str = "", tier: str = "") -> Iterator[None]:
    """Raise the translated error for anything the block raises from a Google SDK."""
    try:
        yield
    except TpuOpsError:
        raise
    except Exception as exc:
        raise translate_google(exc, service, zone=zone, tier=tier) from exc


@contextmanager
def aws_errors(service: str) -> Iterator[None]:
    """Raise the translated error for anything the block raises from botocore."""
    try:
        yield
    except TpuOpsError:
        raise
    except Exception as exc:
        raise translate_boto(exc, service) from exc
