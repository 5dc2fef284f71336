"""Typed specs for everything a user passes in; each is usable as a Prefect flow parameter."""

from tpu_ops.specs.common import GcsUri, Name, RunId, S3Uri, StrictModel
from tpu_ops.specs.jobs import ExportSpec, MirrorSpec, PipelineSpec, TrainJobSpec, TrainSpec
from tpu_ops.specs.loader import load_spec, parse_spec
from tpu_ops.specs.messages import format_errors
from tpu_ops.specs.slice import (
    CapacityLadder,
    ProvisionSpec,
    Rung,
    SliceSpec,
)
from tpu_ops.tiers import Tier

__all__ = [
    "CapacityLadder",
    "ExportSpec",
    "GcsUri",
    "MirrorSpec",
    "Name",
    "PipelineSpec",
    "ProvisionSpec",
    "RunId",
    "Rung",
    "S3Uri",
    "SliceSpec",
    "StrictModel",
    "Tier",
    "TrainJobSpec",
    "TrainSpec",
    "format_errors",
    "load_spec",
    "parse_spec",
]
