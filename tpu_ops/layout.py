"""A run's id and its paths: the one rule for run ids, the one owner of ``RUN/_tpu_ops/...``.

``RUN = <checkpoint_dir>/<run_id>``; checkpoint steps under ``RUN[/<checkpoint_subdir>]/<step>/``;
everything tpu-ops writes about the run under ``RUN/_tpu_ops/`` (a non-numeric name, so the
checkpoint finder never takes it for a step). A mirrored dataset keeps its manifests under
``DEST/_tpu_ops/`` the same way. The workers' agent (standard library only) never spells the
segment: it reads the run's state beside the job document it is handed (``RUN/_tpu_ops/job.json``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from tpu_ops.errors import SpecError
from tpu_ops.uris import ObjectUri, parse_gs

STATE_DIR: Final = "_tpu_ops"
MAX_RUN_ID: Final = 40  # leaves room for "-a<attempt>" inside Google's 63-character resource ids
RUN_ID_PATTERN: Final = r"^[a-z]([-a-z0-9]{0,38}[a-z0-9])?$"
_RUN_ID = re.compile(RUN_ID_PATTERN)


def run_id_problem(run_id: str) -> str | None:
    """What is wrong with ``run_id``, or None if it is a valid run id."""
    # fullmatch: ``$`` also matches before a final newline, so ``match`` let "run\n" through
    if _RUN_ID.fullmatch(run_id):
        return None
    return (
        f"run id {run_id!r} is not allowed: 1-{MAX_RUN_ID} lowercase letters, digits and '-', "
        "starting with a letter and not ending with '-'"
    )


def check_run_id(run_id: str) -> str:
    """Return ``run_id`` or raise ``SpecError`` saying what is allowed."""
    problem = run_id_problem(run_id)
    if problem:
        raise SpecError(problem, [{"field": "run_id", "value": run_id}])
    return run_id


def state_root(root: ObjectUri) -> ObjectUri:
    """``ROOT/_tpu_ops``: where tpu-ops keeps its own records beside data it does not own."""
    return root.child(STATE_DIR)


@dataclass(frozen=True)
class RunLayout:
    """The GCS paths of one run."""

    run_uri: str
    checkpoint_subdir: str = ""

    @classmethod
    def of(cls, checkpoint_dir: str, run_id: str, checkpoint_subdir: str = "") -> RunLayout:
        return cls(str(parse_gs(checkpoint_dir).child(check_run_id(run_id))), checkpoint_subdir)

    @property
    def run(self) -> ObjectUri:
        return parse_gs(self.run_uri)

    @property
    def steps_uri(self) -> str:
        """The directory holding ``<step>/`` entries (the finder's ``run_uri``)."""
        return str(self.run.child(self.checkpoint_subdir)) if self.checkpoint_subdir else self.run_uri

    @property
    def state_dir(self) -> ObjectUri:
        """``RUN/_tpu_ops``: every record tpu-ops keeps about the run."""
        return state_root(self.run)

    def state(self, relative: str) -> ObjectUri:
        return self.state_dir.child(relative)

    @property
    def job(self) -> ObjectUri:
        """The job document every worker's agent reads; the agent finds the run's state beside it."""
        return self.state("job.json")

    @property
    def done(self) -> ObjectUri:
        return self.state("DONE")

    @property
    def goodput(self) -> ObjectUri:
        return self.state("goodput.json")

    @property
    def run_state(self) -> ObjectUri:
        """The run's history (incarnations, preemptions, step times): the report is derived from it."""
        return self.state("state.json")

    @property
    def ledger(self) -> ObjectUri:
        """The supervisor's copy of the run's billing events, for ``status`` elsewhere (``train.costs``)."""
        return self.state("ledger.json")

    @property
    def lease(self) -> ObjectUri:
        """Which supervisor holds the run (written with generation preconditions)."""
        return self.state("lease.json")

    @property
    def capacity(self) -> ObjectUri:
        """What the run's slices were (accelerator, tier, zone), for the capacity history."""
        return self.state("capacity.json")

    @property
    def plan(self) -> ObjectUri:
        """The cost-ranked plan the run was started with, when it was chosen by expected cost."""
        return self.state("plan.json")

    @property
    def notices(self) -> ObjectUri:
        """The agents' SIGTERM notices (``notices/worker-N.json``): a preemption under way."""
        return self.state("notices")

    @property
    def cancel(self) -> ObjectUri:
        """Written by ``tpu-ops cancel``: the supervisor stops the run and tears it down."""
        return self.state("CANCEL")

    @property
    def logs(self) -> ObjectUri:
        """The trainers' output, shipped by the agents: ``logs/<incarnation>/worker-N/<offset>-<ms>.log``."""
        return self.state("logs")

    @property
    def preflight(self) -> ObjectUri:
        """The workers' pre-flight reports of the pinned snapshot (``preflight/worker-N.json``)."""
        return self.state("preflight")

    @property
    def agent_dir(self) -> ObjectUri:
        return self.state("agent")

    @property
    def heartbeats(self) -> ObjectUri:
        return self.state("heartbeats")

    @property
    def workers(self) -> ObjectUri:
        return self.state("workers")

    def heartbeat(self, worker: int) -> ObjectUri:
        return self.state(f"heartbeats/worker-{worker}.json")

    def worker_report(self, worker: int) -> ObjectUri:
        return self.state(f"workers/worker-{worker}.json")
