"""Every event tpu-ops records or announces: one name each, for the audit chain, lineage and Prefect.

An audit record's ``event`` is the enum's value (``slice.preempted``); the Prefect event about the
same thing is :func:`prefect_name` of it (``tpu-ops.slice.preempted``): the prefix is added here only.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final

PREFECT_PREFIX: Final = "tpu-ops."


class AuditEvent(StrEnum):
    """The names of what happened to a run (or to the trail itself)."""

    DATASET_MIRRORED = "dataset.mirrored"
    SNAPSHOT_COMMITTED = "snapshot.committed"  # a Prefect event only: the record is dataset.mirrored
    SLICE_PROVISION_ATTEMPT = "slice.provision_attempt"
    SLICE_PROVISIONED = "slice.provisioned"
    SLICE_PREEMPTED = "slice.preempted"
    SLICE_RECOVERED = "slice.recovered"
    SLICE_DELETED = "slice.deleted"
    SLICE_MOVED = "slice.moved"  # a voluntary move at a checkpoint (train.moves): moved, refused or abandoned
    TRAIN_FINISHED = "train.finished"
    MODEL_ARTIFACT_UPLOADED = "model.artifact_uploaded"
    MODEL_EXPORTED = "model.exported"
    MODEL_EXPORT_SKIPPED = "model.export_skipped"
    MODEL_APPROVED = "model.approved"
    MODEL_REJECTED = "model.rejected"
    MODEL_DEPLOYED = "model.deployed"
    RUN_ENDED = "run.ended"
    RUN_CANCELLED = "run.cancelled"  # tpu-ops cancel: who asked, what was torn down
    RUN_REAPED = "run.reaped"
    AUDIT_DIGEST = "audit.digest"
    AUDIT_SEAL = "audit.seal"  # a scheduled digest naming every chain's head
    AUDIT_SPOOL_QUARANTINED = "audit.spool_quarantined"
    AUDIT_FOREIGN_OBJECT = "audit.foreign_object"


def prefect_name(event: AuditEvent) -> str:
    """The Prefect event name of ``event``: ``tpu-ops.<event>``."""
    return PREFECT_PREFIX + event.value
