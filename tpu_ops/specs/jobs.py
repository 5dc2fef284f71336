"""Specs for the mirror, training, export and the whole retraining pipeline."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, model_validator

from tpu_ops.specs.common import Duration, GcsUri, Name, ObjectKey, RunId, S3Uri, StrictModel
from tpu_ops.specs.slice import ProvisionSpec

_LOCATION = re.compile(r"^[A-Z0-9-]{2,40}$")
_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*(:[A-Za-z_][A-Za-z0-9_]*)?$")
_HP_KEY = re.compile(r"^[a-z][a-z0-9_]{0,62}$")
_PACKAGE_GROUP = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$")
_IMAGE = re.compile(r"^[a-z0-9][a-z0-9.-]*(:[0-9]+)?(/[a-z0-9._-]+)+(:[A-Za-z0-9._-]{1,128}|@sha256:[0-9a-f]{64})$")
_CRON = re.compile(r"^(\S+\s+){4}\S+$")


def _upper_locations(values: list[str]) -> list[str]:
    out = [v.upper() for v in values]
    for v in out:
        if not _LOCATION.match(v):
            raise ValueError(f"bucket location {v!r} is not a GCS location like 'US', 'EU' or 'US-CENTRAL1'")
    return out


class MirrorSpec(StrictModel):
    """Mirror a curated dataset from S3 to GCS as a pinned, verified snapshot."""

    source: S3Uri = Field(description="s3://bucket/prefix of the curated dataset")
    destination: GcsUri = Field(description="gs://bucket/prefix to mirror into")
    snapshot: Name | None = Field(None, description="Snapshot name; defaults to one derived from content.")
    concurrency: int = Field(8, ge=1, le=64, description="Objects copied at once.")
    part_size_mib: int = Field(
        32, ge=1, le=512, description="Part size for objects copied in parallel ranged parts (see ranged_min_mib)."
    )
    ranged_min_mib: int = Field(
        256,
        ge=8,
        le=1024 * 1024,
        description="Objects of at least this size are copied in parallel ranged parts and composed; "
        "smaller ones stream in one GET and one upload.",
    )
    schema_file: ObjectKey = Field("_schema.yaml", description="Schema file in the source prefix.")
    require_schema: bool = Field(
        False, description="Refuse a source without its schema file (otherwise it is copied unchecked, with a warning)."
    )
    allowed_locations: Annotated[list[str], AfterValidator(_upper_locations)] = Field(
        default_factory=list,
        description="GCS bucket locations the data may be written to (data residency); empty = any.",
    )


class TrainSpec(StrictModel):
    """Train on a slice from a pinned dataset manifest, checkpointing to GCS."""

    dataset_manifest: GcsUri | None = Field(
        None, description="gs:// URI of a snapshot manifest; in a pipeline, the mirror's manifest."
    )
    checkpoint_dir: GcsUri = Field(description="gs://bucket/prefix for Orbax-layout checkpoints")
    trainer: str = Field("tpu_ops.train.reference", description="Python module[:function] the agent runs.")
    steps: int = Field(ge=1, le=10_000_000)
    checkpoint_every: int = Field(ge=1, le=1_000_000)
    hyperparameters: dict[str, float | int | str | bool] = Field(default_factory=dict)
    max_recoveries: int = Field(10, ge=0, le=1000, description="Preemptions to recover from before giving up.")
    max_duration: Duration(timedelta(minutes=1), timedelta(days=30)) = Field(  # type: ignore[valid-type]
        timedelta(hours=24), description="Wall-clock limit for the whole training run."
    )

    @model_validator(mode="after")
    def _check(self) -> TrainSpec:
        if not _MODULE.match(self.trainer):
            raise ValueError(f"trainer {self.trainer!r} is not a Python module path like 'pkg.mod:main'")
        if self.checkpoint_every > self.steps:
            raise ValueError(f"checkpoint_every ({self.checkpoint_every}) is larger than steps ({self.steps})")
        for key, value in self.hyperparameters.items():
            if not _HP_KEY.match(key):
                raise ValueError(f"hyperparameter name {key!r} is not allowed: lowercase identifier, ≤ 63")
            if isinstance(value, str) and (len(value) > 256 or any(ord(c) < 32 for c in value)):
                raise ValueError(f"hyperparameter {key!r} value is too long or has control characters")
        return self


class ExportSpec(StrictModel):
    """Export the final checkpoint to S3 and register a SageMaker model package."""

    destination: S3Uri = Field(description="s3://bucket/prefix for model.tar.gz")
    model_package_group: str = Field(description="SageMaker model package group name")
    approval_status: Literal["PendingManualApproval", "Approved", "Rejected"] = "PendingManualApproval"
    image_uri: str = Field(
        "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-inference:2.5-cpu-py311",
        description="Inference container image for the model package.",
    )
    checkpoint: GcsUri | None = Field(None, description="Checkpoint to export; in a pipeline, the final one.")

    @model_validator(mode="after")
    def _check(self) -> ExportSpec:
        if not _PACKAGE_GROUP.match(self.model_package_group):
            raise ValueError(
                f"model_package_group {self.model_package_group!r} is not allowed: letters, digits and '-', "
                "≤ 63, starting with a letter or digit"
            )
        if not _IMAGE.match(self.image_uri):
            raise ValueError(f"image_uri {self.image_uri!r} is not a container image reference with a tag")
        return self


class PipelineSpec(StrictModel):
    """The whole retraining pipeline: mirror → provision → train → export, audited."""

    name: Name = Field(description="Pipeline name; run ids are derived from it.")
    run_id: RunId | None = Field(None, description="Fix the run id (re-running it resumes); default: new.")
    mirror: MirrorSpec
    provision: ProvisionSpec
    train: TrainSpec
    export: ExportSpec
    schedule: str | None = Field(None, description="Cron expression for recurring retraining.")
    audit_bucket: S3Uri | None = Field(None, description="s3:// prefix of the audit trail (Object Lock).")

    @model_validator(mode="after")
    def _check(self) -> PipelineSpec:
        if self.schedule is not None and not _CRON.match(self.schedule):
            raise ValueError(f"schedule {self.schedule!r} is not a 5-field cron expression like '0 3 * * 1'")
        return self
