"""The supervisor's two hooks into the cost-ranked ladder (kept here so the supervisor's edit is small).

- :func:`for_job`: a job whose ladder is ranked (``choose`` / ``ladder: auto``) gets the run's facts
  filled in: its steps, checkpoint interval, history (the checkpoint dir) and deadline
  (``train.max_duration`` unless the spec set one).
- :func:`record_identity`: every supervised run writes ``RUN/_tpu_ops/capacity.json`` (accelerator
  type, backend, chips), which the capacity history keys its records by.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tpu_ops.provision import history, ranking
from tpu_ops.specs.jobs import TrainJobSpec
from tpu_ops.train.checkpoints import latest_complete_step
from tpu_ops.train.layout import RunLayout


def for_job(job: TrainJobSpec) -> TrainJobSpec:
    """``job`` with ``provision.choose`` completed from ``train`` (unchanged without ``choose``)."""
    if job.provision.choose is None:
        return job
    t = job.train
    spec = ranking.for_job(job.provision, steps=t.steps, checkpoint_every=t.checkpoint_every,
                           checkpoint_dir=t.checkpoint_dir, max_duration_s=t.max_duration.total_seconds())  # fmt: skip
    return job.model_copy(update={"provision": spec})


def kept_steps(supervisor: Any) -> Callable[[], int | None]:
    """The newest complete checkpoint of the supervisor's run, read when the ladder walks."""
    return lambda: latest_complete_step(supervisor.gcs, supervisor.layout.steps_uri)


def record_identity(gcs: Any, layout: RunLayout, job: TrainJobSpec) -> None:
    """What the run's slices are, for the capacity history (``RUN/_tpu_ops/capacity.json``)."""
    acc = job.provision.slice.accelerator
    history.write_identity(gcs, layout.run, acc.name, ranking.backend_of(job.provision), acc.chips)
