"""The supervisor's two hooks into the cost-ranked ladder (kept here so the supervisor's edit is small).

- :func:`for_job`: a job whose ladder is ranked (``choose`` / ``ladder: auto``) gets the run's facts
  filled in: its steps, checkpoint interval, history (the checkpoint dir) and deadline
  (``train.max_duration`` unless the spec set one).
- :func:`noting_stockouts`: the requests the ladder finds refused for capacity go into the run's
  state, from which the history learns how often each rung is full.
- :func:`record_identity`: every supervised run writes ``RUN/_tpu_ops/capacity.json`` (accelerator
  type, backend, chips), which the capacity history keys its records by.
- :func:`state_store`: the run's state store, which also publishes the run's entry into the capacity
  summary (``<checkpoint_dir>/_tpu_ops/capacity-summary.json``) whenever a milestone changes, so a
  ranking reads the history in one request.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

from tpu_ops.errors import TpuOpsError
from tpu_ops.provision import history, ranking
from tpu_ops.provision.records import Outcome
from tpu_ops.specs.jobs import TrainJobSpec
from tpu_ops.train.checkpoints import latest_complete_step
from tpu_ops.train.layout import RunLayout
from tpu_ops.train.runstate import RunState, StateStore
from tpu_ops.uris import parse_gs


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


def noting_stockouts(supervisor: Any, on_attempt: Callable[[Any], None] | None) -> Callable[[Any], None]:
    """``on_attempt``, which also keeps each request refused for capacity in the run's state, where the
    capacity history counts how often a rung is full (its scarcity; published with the next milestone)."""

    def note(attempt: Any) -> None:
        if attempt.outcome == Outcome.STOCKOUT and getattr(supervisor, "state", None) is not None:
            supervisor.state.stockouts.append({"zone": attempt.zone, "tier": attempt.tier, "at": time.time()})
        if on_attempt is not None:
            on_attempt(attempt)

    return note


def record_identity(gcs: Any, layout: RunLayout, job: TrainJobSpec) -> None:
    """What the run's slices are, for the capacity history (``RUN/_tpu_ops/capacity.json``)."""
    acc = job.provision.slice.accelerator
    history.write_identity(gcs, layout.run, acc.name, ranking.backend_of(job.provision), acc.chips)


def identity(job: TrainJobSpec) -> dict[str, Any]:
    acc = job.provision.slice.accelerator
    return {"accelerator_type": acc.name, "backend": ranking.backend_of(job.provision), "chips": acc.chips}


class PublishingStore(StateStore):
    """``state.json`` as before; and, when the run's milestones change, its capacity summary entry."""

    def __init__(self, gcs: Any, layout: RunLayout, job: TrainJobSpec, run_id: str) -> None:
        super().__init__(gcs, layout.run_state)
        self.root, self.run_id, self.identity = parse_gs(job.train.checkpoint_dir), run_id, identity(job)
        self._published: tuple[Any, ...] | None = None

    def save(self, state: RunState) -> None:
        super().save(state)
        record = state.to_json()
        mark = history.milestones(record)
        if mark != self._published:
            # The summary is an index of what state.json already holds: a failure to update it costs
            # the next ranking this run's latest news, never the run.
            with contextlib.suppress(TpuOpsError):
                history.publish(self.gcs, self.root, self.run_id, record, self.identity)
                self._published = mark


def state_store(gcs: Any, layout: RunLayout, job: TrainJobSpec, run_id: str) -> StateStore:
    """The supervisor's state store (:class:`PublishingStore`)."""
    return PublishingStore(gcs, layout, job, run_id)
