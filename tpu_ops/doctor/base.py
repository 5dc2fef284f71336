"""The doctor's report lines and the guard that turns any failed check into a MISSING line.

Every check reads; none writes or creates anything. Each answers OK, MISSING (with what to do about
it) or SKIPPED (nothing to check: e.g. no KMS key configured). ``run_checks`` never raises for a
cloud problem: a failed call is a MISSING line naming the call and the error.

On an emulator some calls have no counterpart (fake-gcs-server serves no ``testIamPermissions``);
there the check falls back to reading the resource and says so in its detail.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    pass

OK, MISSING, SKIPPED = "ok", "missing", "skipped"
# What the flows do in a bucket they mirror or checkpoint into (infra/iam/gcp/tpu_ops_flows.yaml).
GCS_PERMISSIONS = (
    "storage.buckets.get",
    "storage.objects.create",
    "storage.objects.delete",
    "storage.objects.get",
    "storage.objects.list",
)
CALL_TIMEOUT_S = 15.0
IAM_DOC = "infra/iam/ (README: Real-cloud set-up)"


@dataclass(frozen=True)
class Check:
    """One line of the report."""

    name: str
    status: str
    detail: str
    fix: str = ""

    def to_json(self) -> dict[str, str]:
        return asdict(self)


def _ok(name: str, detail: str) -> Check:
    return Check(name, OK, detail)


def _missing(name: str, detail: str, fix: str) -> Check:
    return Check(name, MISSING, detail, fix)


def _guard(name: str, fix: str, fn: Callable[[], Check | list[Check]]) -> list[Check]:
    """Run one check; any error becomes a MISSING line naming it (the report goes on)."""
    from tpu_ops.cloud.translate import explain, missing_bucket
    from tpu_ops.errors import CredentialsError

    try:
        out = fn()
    except Exception as exc:  # a doctor reports every failure; it never stops at the first
        why = explain(exc)
        if isinstance(why, CredentialsError):  # the check's own fix would mislead: nothing was asked
            return [_missing(name, str(why), why.fix)]
        if bucket := missing_bucket(exc):  # no permission to grant on a bucket that is not there
            return [_missing(name, f"bucket {bucket} does not exist", create_bucket_fix(bucket))]
        return [_missing(name, _short(exc) or type(exc).__name__, fix)]
    return out if isinstance(out, list) else [out]


def create_bucket_fix(bucket: str) -> str:
    """How to create ``gs://NAME`` or ``s3://NAME`` (or correct the spec that names it)."""
    name = bucket.split("://", 1)[-1]
    if bucket.startswith("gs://"):
        return f"create it: gcloud storage buckets create {bucket} --location=REGION (or correct the spec's URI)"
    return f"create it: aws s3api create-bucket --bucket {name} (or correct the spec's URI)"


LOCAL_SEED_FIX = "the local stack was not seeded: run `tpu-ops local seed`"


def _short(exc: BaseException, limit: int = 300) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
