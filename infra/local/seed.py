"""Seed the emulated clouds for a dry run: a curated dataset in S3 and the buckets it goes to.

The dataset is what a curation job would publish: a ``_schema.yaml`` declaring the shards, and
safetensors shards that match it (tokens as int32, a loss mask as float16).
"""

from __future__ import annotations

import json
import urllib.request
from dataclasses import dataclass
from typing import Any

import numpy as np
import yaml
from safetensors.numpy import save

from tpu_ops.cloud.clients import boto3_client, shared_client, storage_client
from tpu_ops.settings import Settings
from tpu_ops.specs import PipelineSpec
from tpu_ops.uris import parse_gs, parse_s3

SEQ_LEN = 256


@dataclass(frozen=True)
class SeededDataset:
    """What was published: where, how many shards, how many bytes."""

    source: str
    shards: int
    bytes: int


def schema_document() -> dict[str, Any]:
    """The schema the demo shards follow (see ``tpu_ops/mirror/schema.py`` for the format)."""
    return {
        "version": 1,
        "shards": [
            {
                "pattern": "train/*.safetensors",
                "format": "safetensors",
                "tensors": [
                    {"name": "tokens", "dtype": "int32", "shape": [None, SEQ_LEN]},
                    {"name": "loss_mask", "dtype": "float16", "shape": [None, SEQ_LEN]},
                ],
            }
        ],
    }


def shard_bytes(index: int, rows: int) -> bytes:
    """One deterministic shard: ``rows`` sequences of ``SEQ_LEN`` tokens."""
    rng = np.random.default_rng(index)
    tokens = rng.integers(0, 32_000, size=(rows, SEQ_LEN), dtype=np.int32)
    mask = (rng.random((rows, SEQ_LEN)) > 0.05).astype(np.float16)
    return save({"tokens": tokens, "loss_mask": mask}, metadata={"shard": str(index)})


def seed_dataset(settings: Settings, source_uri: str, *, shards: int = 16, rows: int = 512) -> SeededDataset:
    """Publish a curated dataset under ``source_uri`` (bucket created, versioning on)."""
    src = parse_s3(source_uri)
    s3 = boto3_client(settings, "s3")
    existing = {b["Name"] for b in s3.list_buckets().get("Buckets", [])}
    if src.bucket not in existing:
        s3.create_bucket(Bucket=src.bucket)
        s3.put_bucket_versioning(Bucket=src.bucket, VersioningConfiguration={"Status": "Enabled"})
    s3.put_object(Bucket=src.bucket, Key=src.key("_schema.yaml"), Body=yaml.safe_dump(schema_document()).encode())
    total = 0
    for i in range(shards):
        body = shard_bytes(i, rows)
        total += len(body)
        s3.put_object(Bucket=src.bucket, Key=src.key(f"train/shard-{i:05d}.safetensors"), Body=body)
    return SeededDataset(str(src), shards, total)


def ensure_gcs_bucket(settings: Settings, uri: str, location: str) -> None:
    """Create the bucket of a ``gs://`` URI in ``location`` unless it exists."""
    gcs = storage_client(settings)
    bucket = parse_gs(uri).bucket
    if gcs.lookup_bucket(bucket) is None:
        gcs.create_bucket(bucket, location=location)


def ensure_s3_bucket(settings: Settings, uri: str, *, object_lock: bool = False) -> None:
    """Create the bucket of an ``s3://`` URI unless it exists."""
    s3 = boto3_client(settings, "s3")
    bucket = parse_s3(uri).bucket
    if bucket not in {b["Name"] for b in s3.list_buckets().get("Buckets", [])}:
        s3.create_bucket(Bucket=bucket, ObjectLockEnabledForBucket=object_lock)


# The capacity the dry run gives the fake TPU API, so the ladder has to work: the reservation is
# too small for a v4-32 (16 chips), spot is stocked out in zone b, and zone c has spot capacity.
DRY_RUN_CAPACITY: dict[str, Any] = {
    "us-central2-b": {"spot": 0, "on-demand": 64, "reservations": {"fraud-v4-reservation": 8}},
    "us-central2-c": {"spot": 64, "on-demand": 64, "reservations": {}},
}


def seed_pipeline(settings: Settings, spec: PipelineSpec) -> SeededDataset:
    """Everything a pipeline spec expects to exist: its curated dataset and its GCS buckets."""
    seeded = seed_dataset(settings, spec.mirror.source)
    location = spec.mirror.allowed_locations[0] if spec.mirror.allowed_locations else "US-CENTRAL1"
    ensure_gcs_bucket(settings, spec.mirror.destination, location)
    ensure_gcs_bucket(settings, spec.train.checkpoint_dir, location)
    # The reference trainer's numpy, where the spec's setup step fetches it (no index on a worker).
    from infra.local.wheelhouse import upload_wheelhouse
    from tpu_ops.uris import parse_gs

    upload_wheelhouse(settings, f"gs://{parse_gs(spec.train.checkpoint_dir).bucket}/wheelhouse")
    return seeded


def set_tpu_capacity(settings: Settings, capacity: dict[str, Any]) -> None:
    """Configure the fake TPU API's capacity through its control endpoint."""
    settings.check_safe("tpu_endpoint")
    if not settings.tpu_endpoint:
        raise ValueError("no TPU endpoint configured")
    url = settings.tpu_endpoint.rstrip("/") + "/_fake/capacity"
    if not url.startswith("http://"):
        raise ValueError(f"the fake TPU API is served over http, not {url!r}")
    req = urllib.request.Request(  # noqa: S310 - http only, loopback checked above
        url,
        data=json.dumps(capacity).encode(),
        headers={"content-type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=10) as resp:  # noqa: S310 - a checked loopback endpoint
        resp.read()


def seed_audit(settings: Settings) -> str:
    """The audit trail's bucket (Object Lock on) and KMS signing key (alias ``AUDIT_KEY_ALIAS``).

    Returns the key's ARN. Idempotent: safe after every reset of the emulated AWS.
    """
    from infra.local.stack import AUDIT_KEY_ALIAS

    ensure_s3_bucket(settings, settings.audit_uri, object_lock=True)
    kms = shared_client(settings, "kms")
    aliases = {a["AliasName"]: a.get("TargetKeyId") for a in kms.list_aliases().get("Aliases", [])}
    key_id = aliases.get(AUDIT_KEY_ALIAS)
    if not key_id:
        key_id = kms.create_key(
            KeySpec="ECC_NIST_P256", KeyUsage="SIGN_VERIFY", Description="tpu-ops audit digests"
        )["KeyMetadata"]["KeyId"]
        kms.create_alias(AliasName=AUDIT_KEY_ALIAS, TargetKeyId=key_id)
    return str(kms.describe_key(KeyId=key_id)["KeyMetadata"]["Arn"])


def ensure_model_bucket(settings: Settings, uri: str) -> None:
    """The export destination bucket, with incomplete multipart uploads expiring after a day."""
    ensure_s3_bucket(settings, uri)
    boto3_client(settings, "s3").put_bucket_lifecycle_configuration(
        Bucket=parse_s3(uri).bucket,
        LifecycleConfiguration={
            "Rules": [
                {
                    "ID": "abort-incomplete-uploads",
                    "Status": "Enabled",
                    "Filter": {"Prefix": ""},
                    "AbortIncompleteMultipartUpload": {"DaysAfterInitiation": 1},
                }
            ]
        },
    )
