"""Translate SDK errors (google.api_core, google.auth, botocore) into the tpu-ops hierarchy, in one place.

Every module outside ``tpu_ops/cloud/`` sees only ``TpuOpsError`` subclasses and the plain values
below (an S3 error code, "is this a connection failure"), never an SDK exception class:

- :func:`translate_google` / :func:`google_errors`: ``google.api_core`` exceptions by HTTP status;
  with a ``zone`` (a create), a stockout is a ``CapacityError`` and an exhausted quota a ``QuotaError``;
- :func:`capacity_error`: the same rule for a long-running operation's error lines (Compute Engine);
- :func:`translate_boto` / :func:`aws_errors`: botocore exceptions by status and error code;
  :func:`aws_error_code` reads the code a caller needs to tell "the object changed" from a failure;
- :func:`google_http_error`: a raw JSON-API response (our streaming GCS transport) as the same error;
- :func:`explain`: what a person must know about any failure (credentials, endpoint, permission).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Final

from tpu_ops.errors import (
    AccessDeniedError,
    AlreadyExistsError,
    CapacityError,
    ChecksumMismatchError,
    CloudError,
    CredentialsError,
    NotFoundError,
    QuotaError,
    TpuOpsError,
    TransientError,
    UnreachableError,
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


# A stockout, whatever API says it (Compute Engine codes, Cloud TPU messages).
_STOCK: Final = re.compile(
    r"RESOURCE_POOL_EXHAUSTED|STOCKOUT|resource pool exhausted|does not have enough resources", re.I
)
_QUOTA: Final = re.compile(r"QUOTA_EXCEEDED|quota", re.I)


def capacity_error(
    text: str, *, zone: str, tier: str, service: str, status: int | None = None, exhausted: bool = False
) -> CapacityError | None:
    """The capacity error a create in ``zone`` met, if ``text`` says so (or ``exhausted``: gRPC code 8).

    A stockout is a ``CapacityError`` for (zone, tier), an exhausted quota a ``QuotaError``, an
    operation's RESOURCE_EXHAUSTED without either word a stockout: each moves the ladder on.
    """
    if _STOCK.search(text):
        return CapacityError(text, zone=zone, tier=tier, service=service, status=status)
    if _QUOTA.search(text):
        return QuotaError(text, zone=zone, tier=tier, service=service, status=status)
    if exhausted:
        return CapacityError(text, zone=zone, tier=tier, service=service, status=status)
    return None


def translate_google(exc: BaseException, service: str = "google", *, zone: str = "", tier: str = "") -> TpuOpsError:
    """Map a ``google.api_core`` / ``google.auth`` / transport exception to a ``TpuOpsError``.

    ``zone`` says the call was a create in that zone: a stockout (any status but 404/409), a quota
    403/429 or gRPC's RESOURCE_EXHAUSTED becomes a ``CapacityError`` / ``QuotaError`` (see
    :func:`capacity_error`). Over HTTP a 429 is a plain TooManyRequests, transient unless it names
    quota; the ResourceExhausted subclass only comes from an operation's error code 8.
    """
    from google.api_core import exceptions as gexc

    if isinstance(exc, TpuOpsError):
        return exc
    text = str(exc)
    if isinstance(exc, gexc.GoogleAPICallError) and zone and exc.code not in (404, 409):
        exhausted = isinstance(exc, gexc.ResourceExhausted)
        if exhausted or exc.code in (403, 429) or _STOCK.search(text):
            found = capacity_error(text, zone=zone, tier=tier, service=service, status=exc.code, exhausted=exhausted)
            if found is not None:
                return found
    if isinstance(exc, gexc.ResourceExhausted) and "quota" in text.lower():
        return QuotaError(text, zone=zone, tier=tier, service=service, status=429)
    if isinstance(exc, gexc.GoogleAPICallError):
        return _by_status(exc.code, text, service, None)
    if isinstance(exc, gexc.RetryError | TimeoutError | ConnectionError):
        return TransientError(f"{service}: {exc}", service=service)
    try:
        import requests

        if isinstance(exc, requests.ConnectionError | requests.Timeout):
            return TransientError(f"{service}: {exc}", service=service)
    except ImportError:  # pragma: no cover - requests ships with google-cloud-storage
        pass
    return CloudError(f"{service}: {type(exc).__name__}: {exc}", service=service)


def google_http_error(response: Any, service: str) -> TpuOpsError:
    """The translated error for a failed ``requests`` response from a Google JSON API (its cause kept)."""
    from google.api_core.exceptions import from_http_response

    raw = from_http_response(response)  # type: ignore[no-untyped-call]
    out = translate_google(raw, service)
    out.__cause__ = raw
    return out


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
    if isinstance(exc, bexc.FlexibleChecksumError):  # raised when a read meets the end of a checked body
        return ChecksumMismatchError(f"{service}: the bytes read do not match the checksum AWS sent ({exc})")
    return CloudError(f"{service}: {type(exc).__name__}: {exc}", service=service)


def aws_error_code(exc: BaseException) -> tuple[str, int]:
    """The error code and HTTP status of a botocore ``ClientError`` (``("", 0)`` for anything else)."""
    resp = getattr(exc, "response", None)
    if not isinstance(resp, dict):
        return "", 0
    return str(resp.get("Error", {}).get("Code", "")), int(resp.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)


def is_aws_connection_error(exc: BaseException) -> bool:
    """True when botocore (or the socket under it) could not get an answer: refused, reset, timed out."""
    from botocore.exceptions import ConnectionError as BotoConnectionError
    from botocore.exceptions import HTTPClientError

    return isinstance(exc, BotoConnectionError | HTTPClientError | ConnectionError | TimeoutError)


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


# -- explaining a failure to a person ----------------------------------------------------------------

GOOGLE_CREDENTIALS_FIX = (
    "run `gcloud auth application-default login`, or set GOOGLE_APPLICATION_CREDENTIALS to a service-account "
    "key file; for the local stack, load the file `tpu-ops local up --env-file FILE` wrote"
)
AWS_CREDENTIALS_FIX = (
    "set AWS_PROFILE, or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (run on AWS with a role); for the local "
    "stack, load the file `tpu-ops local up --env-file FILE` wrote"
)
PERMISSION_FIX = "grant the flows' role what infra/iam/ lists; `tpu-ops doctor` names each missing permission"


# A 404 on a bucket itself, on listing it or on uploading into it: the bucket is missing (a 404 on
# ``/b/NAME/o/OBJECT`` is a missing object, not this).
_GCS_BUCKET_URL: Final = re.compile(r"/storage/v1/b/([^/?\s]+)(?:/o)?(?=[?\s:]|$)")


def missing_bucket(exc: BaseException) -> str:
    """``gs://NAME`` or ``s3://NAME`` when ``exc`` (or what caused it) says that bucket does not exist; else ""."""
    from urllib.parse import unquote

    for e in _chain(exc):
        code, status = aws_error_code(e)
        if code == "NoSuchBucket":
            name = str(getattr(e, "response", {}).get("Error", {}).get("BucketName", ""))
            return f"s3://{name}" if name else "an S3 bucket"
        status = status or getattr(e, "code", None) or getattr(e, "status", None) or 0
        if status == 404 and (m := _GCS_BUCKET_URL.search(str(e))):
            return f"gs://{unquote(m.group(1))}"
    return ""


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and what caused it (``__cause__``, ``__context__``, a RetryError's cause), outermost first."""
    out: list[BaseException] = []
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop(0)
        if e is None or any(e is seen for seen in out) or len(out) > 20:
            continue
        out.append(e)
        cause = getattr(e, "cause", None)  # google.api_core's RetryError keeps the last error here
        todo += [e.__cause__, e.__context__, cause if isinstance(cause, BaseException) else None]
        todo += [x for x in getattr(e, "exceptions", ()) if isinstance(x, BaseException)]  # exception groups
    return out


def _url_of(exc: BaseException) -> str:
    """The URL or host an SDK's connection error names, if it names one."""
    import re
    from urllib.parse import urlsplit

    kwargs = getattr(exc, "kwargs", None)
    url: object = kwargs.get("endpoint_url") if isinstance(kwargs, dict) else None  # botocore
    try:
        url = url or getattr(getattr(exc, "request", None), "url", None)  # requests; httpx raises when unset
    except RuntimeError:
        url = None
    if url:
        parts = urlsplit(str(url))
        return f"{parts.scheme}://{parts.netloc}" if parts.netloc else str(url)

    found = re.search(r"https?://[^\s'\"/]+|host='([^']+)', port=(\d+)", str(exc))
    if found and found.group(1):
        return f"{found.group(1)}:{found.group(2)}"
    return found.group(0) if found else ""


def _is_connection_failure(exc: BaseException) -> bool:
    names = {c.__name__ for c in type(exc).__mro__}
    known = {
        "EndpointConnectionError",  # botocore
        "ConnectTimeoutError",
        "ConnectionError",  # requests, and the builtin (refused, reset)
        "ConnectError",  # httpx (Prefect's client)
        "ConnectTimeout",
        "NewConnectionError",  # urllib3
        "MaxRetryError",
        "gaierror",  # unknown host
    }
    return bool(names & known)


def _missing_credentials(e: BaseException) -> TpuOpsError | None:
    """A ``CredentialsError`` if ``e`` is an SDK's "no credentials" error."""
    module, name = type(e).__module__, type(e).__name__
    if module.startswith("google.auth") and name in ("DefaultCredentialsError", "RefreshError"):
        found = name == "DefaultCredentialsError"
        what = "Google Cloud credentials not found" if found else "Google Cloud credentials were refused"
        out: TpuOpsError = CredentialsError(what, service="google")
        out.fix = GOOGLE_CREDENTIALS_FIX
        return out
    aws = {
        "NoCredentialsError": "AWS credentials not found",
        "PartialCredentialsError": f"AWS credentials incomplete ({e})",
        "ProfileNotFound": f"AWS profile not found ({e})",
        "NoRegionError": "no AWS region set",
    }
    if module.startswith("botocore") and name in aws:
        out = CredentialsError(aws[name], service="aws")
        out.fix = "set AWS_DEFAULT_REGION" if name == "NoRegionError" else AWS_CREDENTIALS_FIX
        return out
    return None


_INVALID_AWS_CREDENTIALS = frozenset(
    {"InvalidAccessKeyId", "InvalidClientTokenId", "SignatureDoesNotMatch", "ExpiredToken",
     "UnrecognizedClientException", "AuthFailure"}
)  # fmt: skip


def _refused(e: BaseException) -> TpuOpsError | None:
    """An ``AccessDeniedError`` (or ``CredentialsError``) if ``e`` is a refused permission or credential."""
    status = getattr(e, "code", None) if type(e).__module__.startswith("google.api_core") else None
    code = ""
    response = getattr(e, "response", None)
    if isinstance(response, dict):  # botocore's ClientError
        code = str((response.get("Error") or {}).get("Code", ""))
        status = status or (response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
    if status == 401 and type(e).__module__.startswith("google.api_core"):  # who, not what: the token was refused
        out: TpuOpsError = CredentialsError("Google Cloud credentials were refused (401 UNAUTHENTICATED)",
                                            service="google", status=401)  # fmt: skip
        out.fix = GOOGLE_CREDENTIALS_FIX
        return out
    if code in _INVALID_AWS_CREDENTIALS:
        out = CredentialsError(f"AWS refused the credentials ({code})", service="aws", status=status)
        out.fix = AWS_CREDENTIALS_FIX
        return out
    if isinstance(e, AccessDeniedError) or status in (401, 403) or code in ("AccessDenied", "AccessDeniedException"):
        first = " ".join(str(e).split())
        out = AccessDeniedError(f"permission refused: {first[:300]}", service=getattr(e, "service", ""))
        out.fix = PERMISSION_FIX
        return out
    return None


def explain(exc: BaseException) -> TpuOpsError:
    """The one thing a person must know about a failure, as a ``TpuOpsError`` with a ``fix``.

    Looks through ``exc``'s causes for a missing credential, an endpoint that did not answer or a
    refused permission (in that order: the deepest reason wins over a wrapper's), whatever SDK
    raised it; anything else comes back as it was (translated, if it came from an SDK).
    """
    chain = _chain(exc)
    for e in chain:
        if (why := _missing_credentials(e)) is not None:
            return why
    for e in chain:
        if isinstance(e, UnreachableError):
            return e
        if _is_connection_failure(e):
            url = _url_of(e) or next((_url_of(x) for x in chain if _url_of(x)), "")
            return UnreachableError(f"cannot reach {url or 'an endpoint'}", endpoint=url)
    for e in chain:
        if (why := _refused(e)) is not None:
            return why
    if isinstance(exc, TpuOpsError):
        return exc
    module = type(exc).__module__
    if module.startswith(("google.", "requests", "urllib3")):
        return translate_google(exc)
    if module.startswith(("botocore", "boto3")):
        return translate_boto(exc)
    return TpuOpsError(f"{type(exc).__name__}: {exc}")
