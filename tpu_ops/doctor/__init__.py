"""Checks a real environment before the first run: reachable APIs, permissions, the resources a spec names.

Every check reads; none writes or creates anything. Each answers OK, MISSING (with what to do about
it) or SKIPPED (nothing to check: e.g. no KMS key configured). ``run_checks`` never raises for a
cloud problem: a failed call is a MISSING line naming the call and the error.

On an emulator some calls have no counterpart (fake-gcs-server serves no ``testIamPermissions``);
there the check falls back to reading the resource and says so in its detail.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from tpu_ops.accelerators import lookup
from tpu_ops.cloud import probes
from tpu_ops.doctor.base import (
    CALL_TIMEOUT_S,
    GCS_PERMISSIONS,
    LOCAL_SEED_FIX,
    MISSING,
    OK,
    SKIPPED,
    Check,
    _guard,
    _missing,
    _ok,
    create_bucket_fix,
)
from tpu_ops.doctor.compute import compute_checks
from tpu_ops.errors import ConfigError
from tpu_ops.settings import Settings, env_name
from tpu_ops.tiers import Tier
from tpu_ops.uris import parse_uri

if TYPE_CHECKING:
    from tpu_ops.specs import PipelineSpec

__all__ = ["MISSING", "OK", "SKIPPED", "Check", "aws_checks", "compute_checks", "failed", "google_checks", "run_checks"]


# -- Google Cloud ---------------------------------------------------------------------------
def _gcs_bucket(settings: Settings, gcs: Any, uri: str, role: str) -> Check:
    bucket_name = parse_uri(uri, "gs").bucket
    name = f"gcs {role}: gs://{bucket_name}"
    emulated = bool(settings.gcs_endpoint)
    access = probes.bucket_access(gcs, bucket_name, GCS_PERMISSIONS, emulated=emulated, timeout_s=CALL_TIMEOUT_S)
    if access.granted is None:  # the emulator has no IAM: the bucket's existence is what can be checked
        return _ok(name, f"exists in {access.location} (emulator: no IAM to test)")
    lacking = [p for p in GCS_PERMISSIONS if p not in access.granted]
    if lacking and probes.bucket_exists(gcs, bucket_name, timeout_s=CALL_TIMEOUT_S) is False:
        return _missing(name, f"bucket gs://{bucket_name} does not exist", create_bucket_fix(f"gs://{bucket_name}"))
    if lacking:
        return _missing(
            name,
            f"the caller lacks {', '.join(lacking)}",
            f"gcloud storage buckets add-iam-policy-binding gs://{bucket_name} --member=serviceAccount:FLOWS_SA "
            f"--role=projects/{settings.gcp_project}/roles/tpu_ops_flows (role: infra/iam/gcp/tpu_ops_flows.yaml)",
        )
    return _ok(name, f"{len(GCS_PERMISSIONS)} permissions granted")


def _tpu_locations(settings: Settings, tpu: Any, zones: list[str]) -> Check:
    listed = probes.tpu_zones(tpu, settings.gcp_project, timeout_s=CALL_TIMEOUT_S)
    absent = [z for z in zones if z not in listed]
    if absent:
        return _missing(
            "tpu locations",
            f"zones {', '.join(absent)} do not offer Cloud TPU to project {settings.gcp_project}",
            "pick zones from `gcloud compute tpus locations list`; the spec's provision.slice.zones",
        )
    return _ok("tpu locations", f"{len(listed)} TPU zones listed; the spec's {', '.join(zones) or 'none'} among them")


def _tpu_accelerator(settings: Settings, tpu: Any, accelerator: str, zones: list[str]) -> list[Check]:
    out = []
    for zone in zones:
        types = probes.tpu_accelerator_types(tpu, settings.gcp_project, zone, timeout_s=CALL_TIMEOUT_S)
        name = f"tpu {accelerator} in {zone}"
        if accelerator in types:
            out.append(_ok(name, "offered"))
        else:
            out.append(_missing(name, f"not offered ({len(types)} types are)", "choose another zone or type"))
    return out


def _reservation(settings: Settings, name: str, zone: str, accelerator: str = "") -> Check:
    """A named reservation, through Cloud TPU v2alpha1's reservations list (v2 has none), and whether
    it is as large as the slice (``standard.size`` in its ``capacityUnits``: chips unless CORES)."""
    project = settings.gcp_project
    leaf = name
    if name.startswith("projects/"):
        parts = name.split("/")
        project, leaf = parts[1], parts[-1]
    parent = f"projects/{project}/locations/{zone}"
    body = probes.tpu_rest_get(settings, f"/v2alpha1/{parent}/reservations", timeout_s=CALL_TIMEOUT_S)
    found = {str(r.get("name", "")).rsplit("/", 1)[-1]: r for r in body.get("reservations", [])}
    label = f"reservation {leaf} in {zone}"
    if leaf not in found:
        return _missing(
            label,
            f"not found in {parent} ({len(found)} reservation(s) there)",
            "check the name with `gcloud alpha compute tpus reservations list --zone "
            f"{zone}`; the ladder's reservation rung names it",
        )
    standard = found[leaf].get("standard") or {}
    size, units = standard.get("size", "?"), str(standard.get("capacityUnits") or "CHIPS").lower()
    if accelerator and isinstance(size, int | str) and str(size).isdigit():
        acc = lookup(accelerator)
        need = acc.chips * acc.cores_per_chip if units == "cores" else acc.chips
        if int(size) < need:
            return _missing(label, f"size {size} {units}, smaller than the slice ({accelerator}: {need} {units})",
                            f"a reservation of at least {need} {units}, or a slice that fits it")  # fmt: skip
        return _ok(label, f"{found[leaf].get('state', '?')}, size {size} {units}; the slice needs {need}")
    return _ok(label, f"{found[leaf].get('state', '?')}, size {size}")


def google_checks(settings: Settings, spec: PipelineSpec | None) -> list[Check]:
    """GCS buckets (permissions); TPU locations, accelerator types and reservations on the TPU API, or
    the Compute Engine API, its TPU quota and reservations when the spec's backend is compute."""
    from tpu_ops.cloud.clients import storage_client, tpu_client

    out: list[Check] = []
    gcs = storage_client(settings)
    if spec is not None:
        for uri, role in ((spec.mirror.destination, "dataset"), (spec.train.checkpoint_dir, "checkpoints")):
            fix = f"create it: gcloud storage buckets create gs://{parse_uri(uri, 'gs').bucket} --location=REGION"
            out += _guard(f"gcs {role}", fix, lambda u=uri, r=role: _gcs_bucket(settings, gcs, u, r))  # type: ignore[misc]
    if spec is not None and spec.provision.slice.resolved_backend == "compute":
        return out + compute_checks(settings, spec)
    tpu = tpu_client(settings)
    zones = list(spec.provision.slice.zones) if spec is not None else []
    enable = "gcloud services enable tpu.googleapis.com; grant tpu.locations.list (infra/iam/gcp/tpu_ops_flows.yaml)"
    out += _guard("tpu locations", enable, lambda: _tpu_locations(settings, tpu, zones))
    if spec is not None:
        accel = spec.provision.slice.accelerator_type
        out += _guard(f"tpu {accel}", enable, lambda: _tpu_accelerator(settings, tpu, accel, zones))
        for rung in spec.provision.ladder:
            if rung.kind == Tier.RESERVATION:
                name, zone = str(rung.name), str(rung.zone)
                out += _guard(f"reservation {name}", enable,
                              lambda n=name, z=zone: _reservation(settings, n, z, accel))  # type: ignore[misc]  # fmt: skip
    return out


# -- AWS ------------------------------------------------------------------------------------
def _aws(settings: Settings, service: str) -> Any:
    from tpu_ops.cloud.clients import boto3_client

    return boto3_client(settings, service, connect_timeout=5, read_timeout=CALL_TIMEOUT_S)


def _s3_source(s3: Any, uri: str) -> Check:
    src = parse_uri(uri, "s3")
    versioning = probes.s3_versioning(s3, src.bucket, src.prefix) or "never enabled"
    detail = f"listable; versioning {versioning}"
    if versioning != "Enabled":
        detail += " (reads pin ETags instead of versions)"
    return _ok(f"s3 source: {uri}", detail)


def _s3_export(s3: Any, uri: str) -> Check:
    dest = parse_uri(uri, "s3")
    probes.s3_reachable(s3, dest.bucket)
    return _ok(f"s3 export: s3://{dest.bucket}", "reachable (write access is not probed: doctor never writes)")


def _s3_audit(s3: Any, uri: str) -> Check:
    bucket = parse_uri(uri, "s3").bucket
    name = f"s3 audit: s3://{bucket}"
    lock = probes.s3_object_lock(s3, bucket)
    if not lock.enabled:
        return _missing(
            name,
            "Object Lock is not enabled: audit records could be deleted or overwritten",
            f"Object Lock can only be turned on for a versioned bucket: aws s3api put-bucket-versioning --bucket "
            f"{bucket} --versioning-configuration Status=Enabled, then aws s3api put-object-lock-configuration "
            f"--bucket {bucket} --object-lock-configuration ObjectLockEnabled=Enabled; policy: "
            "infra/iam/aws/audit-bucket-policy.json",
        )
    default = f"default {lock.mode} {lock.days or lock.years}" if lock.mode else "no default retention"
    return _ok(name, f"Object Lock enabled ({default})")


def _model_group(sm: Any, group: str) -> Check:
    name = f"sagemaker group: {group}"
    status = probes.model_package_group_status(sm, group)
    if status is None:  # the first export creates it (sagemaker:CreateModelPackageGroup is in the flows' policy)
        return _ok(name, f"not created yet: the first export creates it (or: aws sagemaker "
                         f"create-model-package-group --model-package-group-name {group})")  # fmt: skip
    return _ok(name, status)


def _kms_key(kms: Any, key_id: str) -> Check:
    key = probes.kms_key(kms, key_id)
    name = f"kms key: {key_id}"
    problems = []
    if key.usage != "SIGN_VERIFY":
        problems.append(f"usage {key.usage} (needs SIGN_VERIFY)")
    if key.state != "Enabled":
        problems.append(f"state {key.state}")
    if problems:
        fix = "aws kms create-key --key-usage SIGN_VERIFY --key-spec ECC_NIST_P256; set TPU_OPS_AUDIT_KMS_KEY_ID"
        return _missing(name, "; ".join(problems), fix)
    return _ok(name, f"{key.spec}, SIGN_VERIFY, enabled")


def aws_checks(settings: Settings, spec: PipelineSpec | None, kms_key_id: str | None = None) -> list[Check]:
    """Identity, the source/export/audit buckets, the model package group, the audit signing key."""
    out: list[Check] = []
    creds = "credentials: AWS_PROFILE, a role, or an AwsCredentials block (never keys in a spec)"
    out += _guard("aws identity", creds, lambda: _ok("aws identity", probes.caller_arn(_aws(settings, "sts"))))
    s3 = _aws(settings, "s3")
    read = "grant infra/iam/aws/flows-role-policy.json (SourceDatasetList/Read) to the flows' role"
    audit_uri = (spec.audit_bucket if spec is not None else None) or getattr(settings, "audit_uri", None)
    if spec is not None:
        out += _guard(f"s3 source: {spec.mirror.source}", read, lambda: _s3_source(s3, spec.mirror.source))
        export_bucket = parse_uri(spec.export.destination, "s3").bucket
        out += _guard(
            f"s3 export: s3://{export_bucket}",
            f"aws s3api create-bucket --bucket {export_bucket}; policy: infra/iam/aws/export-bucket-policy.json",
            lambda: _s3_export(s3, spec.export.destination),
        )
        group = spec.export.model_package_group
        sm = "grant infra/iam/aws/flows-role-policy.json (ModelRegistry)"
        out += _guard(f"sagemaker group: {group}", sm, lambda: _model_group(_aws(settings, "sagemaker"), group))
    if audit_uri:
        lock = "create it with --object-lock-enabled-for-bucket (infra/iam/aws/audit-bucket-policy.json)"
        out += _guard(f"s3 audit: {audit_uri}", lock, lambda: _s3_audit(s3, str(audit_uri)))
    else:
        out.append(Check("s3 audit", SKIPPED, "no audit bucket in the spec (audit_bucket) or settings"))
    key_id = kms_key_id or getattr(settings, "audit_kms_key_id", None)
    if key_id:
        kms = "grant infra/iam/aws/flows-role-policy.json (SignAuditDigests) on the key"
        out += _guard(f"kms key: {key_id}", kms, lambda: _kms_key(_aws(settings, "kms"), str(key_id)))
    else:
        out.append(Check("kms key", SKIPPED, "no audit signing key (TPU_OPS_AUDIT_KMS_KEY_ID): digests are unsigned"))
    return out


def _unanswered(settings: Settings, timeout_s: float = 3.0) -> list[tuple[str, str, str]]:
    """Configured endpoints (emulators, private endpoints) that refuse a TCP connection."""
    import socket
    from urllib.parse import urlsplit

    out = []
    for name in ("aws_endpoint_url", "gcs_endpoint", "tpu_endpoint", "compute_endpoint"):
        url = settings.endpoints()[name]
        if not url:
            continue  # the real cloud's own endpoint: the checks below reach it
        parts = urlsplit(url if "://" in url else "http://" + url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        try:
            socket.create_connection((parts.hostname or "", port), timeout=timeout_s).close()
        except OSError as exc:
            out.append((name, url, exc.strerror or type(exc).__name__))
    return out


def run_checks(settings: Settings, spec: PipelineSpec | None = None, kms_key_id: str | None = None) -> list[Check]:
    """Every check, in order: endpoints first (a dry run with a missing one stops there), then each cloud."""
    try:
        settings.check_safe()
    except ConfigError as exc:
        return [_missing("endpoints", str(exc), "source the file `tpu-ops local up --env-file` wrote")]
    dead = [
        _missing(
            f"endpoint {name}",
            f"{url} does not answer ({why})",
            f"start it (`tpu-ops local up`), or unset {env_name(name)} for the real cloud",
        )
        for name, url, why in _unanswered(settings)
    ]
    if dead:  # nothing else can be checked against an endpoint that is not there
        return dead
    settings = settings.model_copy(update={"retry_attempts": min(settings.retry_attempts, 2)})  # fail fast
    checks = _cloud(google_checks, settings, spec) + _cloud(aws_checks, settings, spec, kms_key_id)
    if settings.dry_run:  # on the local stack a missing bucket means it was never seeded
        checks = [replace(c, fix=LOCAL_SEED_FIX) if c.detail.endswith("does not exist") else c for c in checks]
    return checks


def _cloud(checks: Callable[..., list[Check]], settings: Settings, *args: Any) -> list[Check]:
    """One cloud's checks; credentials that cannot be found or are refused are one MISSING line."""
    from tpu_ops.cloud.translate import explain
    from tpu_ops.errors import CredentialsError

    try:
        return checks(settings, *args)
    except Exception as exc:
        why = explain(exc)
        if not isinstance(why, CredentialsError):
            raise
        return [_missing(f"{why.service} credentials", str(why), why.fix)]


def failed(checks: list[Check]) -> list[Check]:
    """The checks that found something missing."""
    return [c for c in checks if c.status == MISSING]
