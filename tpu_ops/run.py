"""One run as every step sees it: built once at the edge (a CLI command or a flow), then passed down.

    run = Run.open("fraud-251120-101500", settings, checkpoint_dir="gs://ckpt/runs")
    run.layout.goodput        # gs://ckpt/runs/fraud-251120-101500/_tpu_ops/goodput.json
    run.clients.gcs()         # the run's clients, built on first use, with the run's credentials
    run.ledger, run.audit     # its event ledger and its audit chain

The id is checked once here (:func:`tpu_ops.layout.check_run_id`); the settings, with the
credentials of the run's blocks, are resolved once by the caller; every client, ledger entry and
audit record of the run then goes through this object, so none is written with other credentials.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

from tpu_ops.audit.recorder import ActorOf, RunAudit
from tpu_ops.audit.trail import AuditTrail
from tpu_ops.cloud.clients import Clients
from tpu_ops.errors import ConfigError
from tpu_ops.layout import RunLayout, check_run_id
from tpu_ops.provision.ledger import Ledger
from tpu_ops.settings import Settings
from tpu_ops.specs.jobs import TrainJobSpec


class Run:
    """A validated run id, its layout (when its checkpoint location is known), clients, ledger and audit."""

    def __init__(
        self,
        run_id: str,
        settings: Settings,
        *,
        layout: RunLayout | None = None,
        clients: Clients | None = None,
        actor: ActorOf | None = None,
    ) -> None:
        self.id = check_run_id(run_id)
        self.settings = settings
        self.clients = clients or Clients(settings)
        self._layout = layout
        self._actor = actor

    @classmethod
    def open(
        cls,
        run_id: str,
        settings: Settings,
        *,
        checkpoint_dir: str | None = None,
        checkpoint_subdir: str = "",
        clients: Clients | None = None,
        actor: ActorOf | None = None,
    ) -> Run:
        """The run ``run_id``; ``RUN = <checkpoint_dir>/<run_id>`` when a checkpoint location is given."""
        layout = RunLayout.of(checkpoint_dir, run_id, checkpoint_subdir) if checkpoint_dir else None
        return cls(run_id, settings, layout=layout, clients=clients, actor=actor)

    @classmethod
    def of_job(cls, run_id: str, settings: Settings, job: TrainJobSpec, **kw: Any) -> Run:
        """The run ``run_id`` of a training job (``RUN = <job.train.checkpoint_dir>/<run_id>``)."""
        t = job.train
        return cls.open(run_id, settings, checkpoint_dir=t.checkpoint_dir, checkpoint_subdir=t.checkpoint_subdir, **kw)

    @property
    def layout(self) -> RunLayout:
        """Where the run keeps its checkpoints and records (``RUN/_tpu_ops/...``)."""
        if self._layout is None:
            raise ConfigError(f"run {self.id}: its checkpoint location is not known here")
        return self._layout

    @property
    def run_uri(self) -> str:
        return self.layout.run_uri

    @cached_property
    def ledger(self) -> Ledger:
        """The run's event ledger (attempts, slices, costs) in the state directory."""
        return Ledger(self.settings, self.id)

    @cached_property
    def trail(self) -> AuditTrail:
        """The audit trail, written with this run's clients (so with its credentials)."""
        return AuditTrail.of(self.clients)

    @cached_property
    def audit(self) -> RunAudit:
        """The run's audit chain: records that never fail the run (see :mod:`tpu_ops.audit.recorder`)."""
        return RunAudit(self.trail, self.id, self._actor)

    def __repr__(self) -> str:  # never the settings: they hold credentials
        where = self._layout.run_uri if self._layout else "?"
        return f"Run({self.id!r}, {where})"
