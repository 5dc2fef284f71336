"""The read-only cloud calls ``tpu-ops doctor`` makes (Google Cloud, AWS), answered as typed values.

Nothing here writes. Errors are left as the SDK raised them: the doctor's guard turns each into a
MISSING line through :func:`tpu_ops.cloud.translate.explain`, naming the call that failed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tpu_ops.settings import Settings


@dataclass(frozen=True)
class BucketAccess:
    """What the caller may do on a bucket: ``granted`` is None where the server has no IAM to ask
    (an emulator); then only the bucket's existence (and ``location``) was checked."""

    granted: frozenset[str] | None
    location: str = ""


def bucket_access(
    gcs: Any, bucket_name: str, permissions: Sequence[str], *, emulated: bool, timeout_s: float
) -> BucketAccess:
    """``testIamPermissions`` on ``bucket_name``; on an emulator that has none, a read of the bucket."""
    from google.api_core.exceptions import NotFound

    bucket = gcs.bucket(bucket_name)
    try:
        granted = bucket.test_iam_permissions(list(permissions), timeout=timeout_s, retry=None)
    except NotFound:
        if not emulated:
            raise
        bucket.reload(timeout=timeout_s, retry=None)
        return BucketAccess(None, str(bucket.location))
    return BucketAccess(frozenset(granted))


def bucket_exists(gcs: Any, bucket_name: str, *, timeout_s: float) -> bool | None:
    """Whether ``bucket_name`` exists; None when the caller may not ask (no ``storage.buckets.get``)."""
    from google.api_core.exceptions import Forbidden, NotFound

    try:
        gcs.bucket(bucket_name).reload(timeout=timeout_s, retry=None)
    except NotFound:
        return False
    except Forbidden:
        return None
    return True


def tpu_zones(tpu: Any, project: str, *, timeout_s: float) -> frozenset[str]:
    """The zones that offer Cloud TPU to ``project`` (``locations.list``)."""
    from google.cloud.location import locations_pb2

    request = locations_pb2.ListLocationsRequest(name=f"projects/{project}")
    return frozenset(loc.location_id for loc in tpu.list_locations(request, retry=None, timeout=timeout_s).locations)


def tpu_accelerator_types(tpu: Any, project: str, zone: str, *, timeout_s: float) -> frozenset[str]:
    """The accelerator types Cloud TPU offers in ``zone``."""
    parent = f"projects/{project}/locations/{zone}"
    return frozenset(t.type_ for t in tpu.list_accelerator_types(parent=parent, retry=None, timeout=timeout_s))


def tpu_rest_get(settings: Settings, path: str, *, timeout_s: float) -> dict[str, Any]:
    """One GET on the TPU REST API (the emulator's endpoint, or tpu.googleapis.com with credentials),
    for what the v2 client has no method for (v2alpha1's reservations)."""

    from tpu_ops.cloud.clients import _google_credentials

    settings.check_safe("tpu_endpoint")
    endpoint = (settings.tpu_endpoint or "https://tpu.googleapis.com").rstrip("/")
    from google.auth.transport.requests import AuthorizedSession

    creds = _google_credentials(settings, emulated=bool(settings.tpu_endpoint))
    if creds is None:  # pragma: no cover - real cloud only
        import google.auth

        creds, _ = google.auth.default(scopes=["https://www.googleapis.com/auth/cloud-platform"])
    session: Any = AuthorizedSession(creds)  # type: ignore[no-untyped-call]
    with session:
        resp = session.get(endpoint + path, timeout=timeout_s)
        resp.raise_for_status()
        body: dict[str, Any] = resp.json()
    return body


# -- AWS -------------------------------------------------------------------------------------------
def caller_arn(sts: Any) -> str:
    """Who the AWS credentials are (``sts:GetCallerIdentity``)."""
    return str(sts.get_caller_identity()["Arn"])


def s3_versioning(s3: Any, bucket: str, prefix: str) -> str:
    """List one key under ``prefix`` (is it listable?), then the bucket's versioning status ("" if never set)."""
    s3.list_objects_v2(Bucket=bucket, Prefix=prefix, MaxKeys=1)
    return str(s3.get_bucket_versioning(Bucket=bucket).get("Status") or "")


def s3_reachable(s3: Any, bucket: str) -> None:
    """``HeadBucket``: raises if the bucket is missing or not ours to see."""
    s3.head_bucket(Bucket=bucket)


@dataclass(frozen=True)
class ObjectLock:
    """A bucket's Object Lock configuration: on or off, and its default retention if any."""

    enabled: bool
    mode: str = ""
    days: int | None = None
    years: int | None = None


def s3_object_lock(s3: Any, bucket: str) -> ObjectLock:
    """The bucket's Object Lock configuration (off when it has none)."""
    try:
        conf = s3.get_object_lock_configuration(Bucket=bucket).get("ObjectLockConfiguration") or {}
    except Exception as exc:
        if "ObjectLockConfigurationNotFound" not in str(exc):  # the error code, in the message
            raise
        conf = {}
    rule = (conf.get("Rule") or {}).get("DefaultRetention") or {}
    return ObjectLock(conf.get("ObjectLockEnabled") == "Enabled", rule.get("Mode", ""), rule.get("Days"),
                      rule.get("Years"))  # fmt: skip


def model_package_group_status(sagemaker: Any, group: str) -> str | None:
    """The SageMaker model package group's status, or None if it does not exist."""
    try:
        desc = sagemaker.describe_model_package_group(ModelPackageGroupName=group)
    except Exception as exc:
        if "does not exist" not in str(exc) and "ValidationException" not in str(exc):
            raise
        return None
    return str(desc.get("ModelPackageGroupStatus", "present"))


@dataclass(frozen=True)
class KmsKey:
    """What the doctor asks of the audit signing key."""

    usage: str
    state: str
    spec: str


def kms_key(kms: Any, key_id: str) -> KmsKey:
    """A KMS key's usage, state and key spec (``DescribeKey``)."""
    meta = kms.describe_key(KeyId=key_id)["KeyMetadata"]
    return KmsKey(str(meta.get("KeyUsage")), str(meta.get("KeyState")), str(meta.get("KeySpec", "?")))
