"""The one SDK -> error-tree translation (tpu_ops.cloud.translate), on the SDKs' own exception classes."""

from __future__ import annotations

import pytest
import requests
from botocore.exceptions import ClientError, EndpointConnectionError, FlexibleChecksumError
from google.api_core import exceptions as gexc

from tpu_ops.cloud.translate import (
    aws_error_code,
    capacity_error,
    google_http_error,
    is_aws_connection_error,
    translate_boto,
    translate_google,
)
from tpu_ops.errors import (
    AccessDeniedError,
    AlreadyExistsError,
    CapacityError,
    ChecksumMismatchError,
    NotFoundError,
    QuotaError,
    TransientError,
)

Z = "us-central2-b"


@pytest.mark.parametrize(
    ("exc", "zone", "expected"),
    [
        # a create (zone given): Cloud TPU's answers
        (gexc.TooManyRequests("Quota exceeded for chips"), Z, QuotaError),
        (gexc.TooManyRequests("slow down"), Z, TransientError),
        (gexc.ResourceExhausted("no capacity"), Z, CapacityError),  # an operation's code 8
        (gexc.ServiceUnavailable("busy"), Z, TransientError),
        # ... and Compute Engine's
        (gexc.Forbidden("QUOTA_EXCEEDED: TPUS_PER_PROJECT"), Z, QuotaError),
        (gexc.ServiceUnavailable("ZONE_RESOURCE_POOL_EXHAUSTED"), Z, CapacityError),
        (gexc.NotFound("ZONE_RESOURCE_POOL_EXHAUSTED in a zone that is not there"), Z, NotFoundError),
        (gexc.Conflict("already exists"), Z, AlreadyExistsError),
        # a read (no zone): a quota 429 is throttling, a 403 a refusal
        (gexc.TooManyRequests("Quota exceeded for reads per minute"), "", TransientError),
        (gexc.Forbidden("quota"), "", AccessDeniedError),
        (gexc.NotFound("gone"), "", NotFoundError),
    ],
)
def test_google_errors_by_status_and_capacity(exc: Exception, zone: str, expected: type) -> None:
    out = translate_google(exc, "tpu", zone=zone, tier="spot")
    assert type(out) is expected
    if isinstance(out, CapacityError):
        assert (out.zone, out.tier) == (Z, "spot")


def test_operation_error_lines_take_the_same_rule() -> None:
    stock = capacity_error("ZONE_RESOURCE_POOL_EXHAUSTED: no v5p", zone=Z, tier="spot", service="compute")
    quota = capacity_error("QUOTA_EXCEEDED: chips", zone=Z, tier="spot", service="compute", status=403)
    assert type(stock) is CapacityError and type(quota) is QuotaError and quota.status == 403
    assert capacity_error("INVALID_ARGUMENT: bad type", zone=Z, tier="spot", service="compute") is None


def _client_error(code: str, status: int) -> ClientError:
    body = {"Error": {"Code": code, "Message": code}, "ResponseMetadata": {"HTTPStatusCode": status, "RequestId": "r1"}}
    return ClientError(body, "GetObject")  # type: ignore[arg-type]


def test_aws_errors_by_code() -> None:
    gone = translate_boto(_client_error("NoSuchKey", 404), "s3")
    assert isinstance(gone, NotFoundError) and gone.request_id == "r1"
    assert isinstance(translate_boto(_client_error("SlowDown", 503), "s3"), TransientError)
    assert aws_error_code(_client_error("PreconditionFailed", 412)) == ("PreconditionFailed", 412)
    assert aws_error_code(ValueError("not an SDK error")) == ("", 0)
    bad = translate_boto(FlexibleChecksumError(error_msg="crc32c mismatch"), "s3")
    assert isinstance(bad, ChecksumMismatchError) and "crc32c mismatch" in str(bad)
    assert is_aws_connection_error(EndpointConnectionError(endpoint_url="http://127.0.0.1:1"))
    assert not is_aws_connection_error(_client_error("NoSuchKey", 404))


def test_a_raw_json_api_response_is_translated_with_its_cause() -> None:
    resp = requests.Response()
    resp.status_code, resp._content = 404, b'{"error": {"code": 404, "message": "No such object: b/o"}}'
    resp.request = requests.Request("GET", "http://127.0.0.1:1/storage/v1/b/b/o/o").prepare()
    out = google_http_error(resp, "gcs")
    assert isinstance(out, NotFoundError) and "No such object" in str(out)
    assert isinstance(out.__cause__, gexc.NotFound)


def test_a_missing_bucket_is_told_from_a_missing_object() -> None:
    from google.api_core.exceptions import NotFound

    from tpu_ops.cloud.translate import missing_bucket

    base = "404 GET http://127.0.0.1:1/storage/v1/b/acme-data"
    assert missing_bucket(NotFound(f"{base}?projection=noAcl: Not Found")) == "gs://acme-data"
    assert missing_bucket(NotFound(f"{base}/o?prefix=x%2F: Not Found")) == "gs://acme-data"
    assert missing_bucket(NotFound(f"{base}/o/train%2Fa.bin?alt=media: Not Found")) == ""
    no_bucket = _client_error("NoSuchBucket", 404)
    no_bucket.response["Error"]["BucketName"] = "acme-src"
    assert missing_bucket(no_bucket) == "s3://acme-src"
    assert missing_bucket(_client_error("NoSuchKey", 404)) == ""
