"""Specs for the mirror, training, export and the whole retraining pipeline."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, ValidationInfo, field_validator, model_validator

from tpu_ops.specs.common import Duration, GcsUri, Name, ObjectKey, RunId, S3Uri, StrictModel
from tpu_ops.specs.slice import ProvisionSpec
from tpu_ops.text import unsafe_char

_LOCATION = re.compile(r"^[A-Z0-9-]{2,40}$")
_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*(:[A-Za-z_][A-Za-z0-9_]*)?$")
_HP_KEY = re.compile(r"^[a-z][a-z0-9_]{0,62}$")
_PACKAGE_GROUP = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$")
_IMAGE = re.compile(r"^[a-z0-9][a-z0-9.-]*(:[0-9]+)?(/[a-z0-9._-]+)+(:[A-Za-z0-9._-]{1,128}|@sha256:[0-9a-f]{64})$")
_CRON = re.compile(r"^(\S+\s+){4}\S+$", re.ASCII)


def _upper_locations(values: list[str]) -> list[str]:
    out = [v.upper() for v in values]
    for v in out:
        if not _LOCATION.fullmatch(v):
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
    engine: Literal["local", "sts", "auto"] = Field(
        "local",
        description="Who copies: this process (local), Storage Transfer Service (sts), or STS from the "
        "settings' size/object-count threshold on (auto). Validation, verification and the manifest are the same.",
    )


_ARG_MAX = 4096
_SUBDIR = re.compile(r"^[A-Za-z0-9_-]+(/[A-Za-z0-9_-]+)*$")


def _check_command(argv: list[str] | None) -> list[str] | None:
    if argv is None:
        return None
    if not argv or not argv[0]:
        raise ValueError("command must be a non-empty argv list, e.g. ['python3', '-m', 'maxtext.train', ...]")
    for arg in argv:
        if len(arg) > _ARG_MAX:
            raise ValueError(f"command argument {arg[:40]!r}... is longer than {_ARG_MAX} characters")
        bad = unsafe_char(arg, allow="\t")
        if bad:
            raise ValueError(f"command argument {arg[:40]!r} has control characters: {bad}")
    return argv


def _check_trainer(value: str) -> str:
    if not _MODULE.fullmatch(value):
        raise ValueError(f"trainer {value!r} is not a Python module path like 'pkg.mod:main'")
    return value


def _check_subdir(value: str) -> str:
    if value and not _SUBDIR.fullmatch(value):
        raise ValueError(f"checkpoint_subdir {value!r} is not allowed: '/'-separated names of [A-Za-z0-9_-]")
    return value


def _check_hyperparameters(values: dict[str, float | int | str | bool]) -> dict[str, float | int | str | bool]:
    for key, value in values.items():
        if not _HP_KEY.fullmatch(key):
            raise ValueError(f"hyperparameter name {key!r} is not allowed: lowercase identifier, ≤ 63")
        if isinstance(value, str) and len(value) > 256:
            raise ValueError(f"hyperparameter {key!r} value is longer than 256 characters")
        bad = unsafe_char(value) if isinstance(value, str) else None
        if bad:
            raise ValueError(f"hyperparameter {key!r} value contains {bad}")
    return values


class TrainSpec(StrictModel):
    """Train on a slice from a pinned dataset manifest, checkpointing to GCS (the job contract).

    Every worker runs ``command`` (an argv list) or, without it, the Python entry point
    ``trainer``, with ``TPU_OPS_*`` variables saying who it is and where to resume (README,
    "Training"). Steps live under ``<checkpoint_dir>/<run_id>/<checkpoint_subdir>/<step>/``.
    """

    dataset_manifest: GcsUri | None = Field(
        None, description="gs:// URI of a snapshot manifest; in a pipeline, the mirror's manifest."
    )
    checkpoint_dir: GcsUri = Field(description="gs://bucket/prefix for Orbax-layout checkpoints")
    checkpoint_subdir: Annotated[str, AfterValidator(_check_subdir)] = Field(
        "",
        description="Where the trainer puts its steps below <checkpoint_dir>/<run_id>: '' for Orbax's "
        "<run>/<step>, 'checkpoints' for MaxText (base_output_directory=checkpoint_dir, run_name=run id).",
    )
    trainer: Annotated[str, AfterValidator(_check_trainer)] = Field(
        "tpu_ops.train.reference:main",
        description="Python module[:function] the agent runs when no command is given (a function starts faster: "
        "the agent imports its module while it resolves the resume step).",
    )
    command: Annotated[list[str] | None, AfterValidator(_check_command)] = Field(
        None, description="argv the agent runs on every worker (instead of trainer), e.g. a MaxText launch."
    )
    setup: Annotated[list[str] | None, AfterValidator(_check_command)] = Field(
        None,
        description="argv run on every VM before the trainer's first start and after every recreate (a fresh "
        "disk), e.g. ['bash', '-c', 'python3 -m venv venv && venv/bin/pip install --no-index --find-links "
        "wheelhouse numpy']; a failure fails the run with its log tail (docs/training.md).",
    )
    python: str | None = Field(
        None,
        max_length=500,
        pattern=r"^[A-Za-z0-9_./+-]+$",
        description="Interpreter for `trainer` (e.g. 'venv/bin/python', made by `setup`; relative to the worker "
        "directory); default: the image's python3 that runs the agent.",
    )
    preemption_notice: bool = Field(
        True,
        description="On SIGTERM each agent writes RUN/_tpu_ops/notices/worker-N.json at once, and the supervisor "
        "starts recovering without waiting for the API to show the preemption.",
    )
    steps: int = Field(ge=1, le=10_000_000, description="Training steps in all (1 to 10,000,000).")
    checkpoint_every: int = Field(
        ge=1,
        le=1_000_000,
        description="Steps between checkpoints, at most `steps`; a preemption loses fewer than this.",
    )
    hyperparameters: Annotated[dict[str, float | int | str | bool], AfterValidator(_check_hyperparameters)] = Field(
        default_factory=dict, description="Passed to the trainer: lowercase names, numbers/strings/booleans."
    )
    max_recoveries: int = Field(10, ge=0, le=1000, description="Preemptions to recover from before giving up.")
    max_duration: Duration(timedelta(minutes=1), timedelta(days=30)) = Field(  # type: ignore[valid-type]
        timedelta(hours=24), description="Wall-clock limit for the whole training run."
    )
    poll_interval: Duration(timedelta(seconds=0.1), timedelta(hours=6)) = Field(  # type: ignore[valid-type]
        timedelta(seconds=5), description="How often the supervisor checks slice state, heartbeats and exits."
    )
    heartbeat_interval: Duration(timedelta(seconds=0.1), timedelta(hours=6)) = Field(  # type: ignore[valid-type]
        timedelta(seconds=5), description="How often each worker's agent writes its heartbeat to GCS."
    )
    stall_limit: Duration(timedelta(seconds=1), timedelta(days=1)) = Field(  # type: ignore[valid-type]
        timedelta(minutes=10),
        description="No new step for this long (first step: after the slice is up) = a hung slice: recover.",
    )
    term_grace: Duration(timedelta(seconds=0), timedelta(minutes=30)) = Field(  # type: ignore[valid-type]
        timedelta(seconds=30), description="After SIGTERM, how long the agent lets the trainer save before SIGKILL."
    )
    coordinator_port: int = Field(8476, ge=1024, le=65535, description="JAX coordinator port on worker 0.")
    goodput_logging: bool = Field(
        False,
        description="Worker 0 also writes ml-goodput-measurement's entries (job name = run id, log "
        "goodput_<run id>) to Cloud Logging, so Google's goodput tools read the run.",
    )

    @field_validator("checkpoint_every")
    @classmethod
    def _not_past_the_end(cls, value: int, info: ValidationInfo) -> int:
        # A field validator (steps is validated first), so the error names checkpoint_every itself.
        steps = info.data.get("steps")
        if steps is not None and value > steps:
            raise ValueError(f"checkpoint_every ({value}) is larger than steps ({steps}); allowed: 1 to {steps}")
        return value


class TrainJobSpec(StrictModel):
    """``tpu-ops train``: a slice through the capacity ladder and the training job that runs on it."""

    provision: ProvisionSpec
    train: TrainSpec


class ExportSpec(StrictModel):
    """Export the final checkpoint to S3 and register a SageMaker model package."""

    destination: S3Uri = Field(description="s3://bucket/prefix for model.tar.gz")
    model_package_group: str = Field(description="SageMaker model package group name")
    approval_status: Literal["PendingManualApproval", "Approved", "Rejected"] = Field(
        "PendingManualApproval", description="The model package's approval status when registered."
    )
    image_uri: str = Field(
        "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-inference:2.5-cpu-py311",
        description="Inference container image for the model package.",
    )
    checkpoint: GcsUri | None = Field(
        None,
        description="The training checkpoint_dir the run wrote under (the run is <checkpoint>/<run_id>; its final "
        "complete step or committed export/ dir is exported); in a pipeline, train.checkpoint_dir.",
    )

    @model_validator(mode="after")
    def _check(self) -> ExportSpec:
        if not _PACKAGE_GROUP.fullmatch(self.model_package_group):
            raise ValueError(
                f"model_package_group {self.model_package_group!r} is not allowed: letters, digits and '-', "
                "≤ 63, starting with a letter or digit"
            )
        if not _IMAGE.fullmatch(self.image_uri):
            raise ValueError(f"image_uri {self.image_uri!r} is not a container image reference with a tag")
        return self


class PipelineSpec(StrictModel):
    """The whole retraining pipeline: mirror → provision → train → export, audited."""

    name: Name = Field(description="Pipeline name; run ids are derived from it.")
    run_id: RunId | None = Field(None, description="Fix the run id (re-running it resumes); default: new.")
    mirror: MirrorSpec = Field(description="Mirror a curated dataset from S3 to GCS as a pinned, verified snapshot.")
    provision: ProvisionSpec = Field(description="The slice and the capacity ladder it is provisioned through.")
    train: TrainSpec = Field(description="The training job: checkpoints, steps, recovery.")
    export: ExportSpec = Field(description="Export the final checkpoint to S3 and SageMaker.")
    schedule: str | None = Field(
        None,
        description="Used only by `tpu-ops serve`: the pipeline deployment's cron schedule (5 fields, UTC, "
        "e.g. '0 3 * * 1'). A run started from a form ignores it.",
    )
    audit_bucket: S3Uri | None = Field(None, description="s3:// prefix of the audit trail (Object Lock).")

    @field_validator("schedule")
    @classmethod
    def _cron(cls, value: str | None) -> str | None:
        if value is not None and not _CRON.fullmatch(value):
            raise ValueError(f"schedule {value!r} is not a 5-field cron expression like '0 3 * * 1' (UTC)")
        return value
