"""Typed specs for everything a user passes in; each is usable as a Prefect flow parameter."""

from tpu_ops.specs.common import GcsUri, Name, RunId, S3Uri, StrictModel
from tpu_ops.specs.jobs import ExportSpec, MirrorSpec, PipelineSpec, TrainJobSpec, TrainSpec
from tpu_ops.specs.loader import format_errors, load_spec, parse_spec
from tpu_ops.specs.slice import (
    CapacityLadder,
    FlexStartRung,
    OnDemandRung,
    ProvisionSpec,
    ReservationRung,
    Rung,
    SliceSpec,
    SpotRung,
)
from tpu_ops.tiers import Tier

__all__ = [
    "CapacityLadder",
    "ExportSpec",
    "FlexStartRung",
    "GcsUri",
    "MirrorSpec",
    "Name",
    "OnDemandRung",
    "PipelineSpec",
    "ProvisionSpec",
    "ReservationRung",
    "RunId",
    "Rung",
    "S3Uri",
    "SliceSpec",
    "SpotRung",
    "StrictModel",
    "Tier",
    "TrainJobSpec",
    "TrainSpec",
    "format_errors",
    "load_spec",
    "parse_spec",
]
