"""The job contract, standard library only: the job document, its GCS paths, and the trainer's variables.

The supervisor uploads a :class:`Job` as ``RUN/_tpu_ops/job.json``; every worker's agent reads
it, and sets the ``TPU_OPS_*`` variables (docs/training.md) that a trainer reads back with
:func:`job_env`. Fields are only ever added, never renamed: an agent ignores fields it does not
know, and a missing field takes its default.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from tpu_ops.agent.gcs import join, split_gs
from tpu_ops.agent.metadata import WorkerIdentity

COMMIT_MARKER = "commit_success.txt"
# Optional fields of worker 0's heartbeat (``RUN/_tpu_ops/heartbeats/worker-0.json``): what one training
# step does across the whole slice, as the trainer's step records say (``agent.goodput_hooks``).
# Absent when the trainer does not say; the run summary then shows no $/M tokens and no MFU.
WORK_FIELDS = ("tokens_per_step", "model_flops_per_step")
# Runs ``module:function`` (or ``module`` as __main__) without putting either into code text.
ENTRY = (
    "import importlib, runpy, sys\n"
    "mod, _, fn = sys.argv[1].partition(':')\n"
    "sys.argv = [mod]\n"
    "sys.exit(getattr(importlib.import_module(mod), fn)() if fn else runpy.run_module(mod, run_name='__main__'))\n"
)


@dataclass
class Job:
    """The job spec the supervisor uploads to ``RUN/_tpu_ops/job.json``."""

    run_id: str
    run_uri: str
    steps: int
    checkpoint_every: int
    command: list[str] | None = None
    trainer: str = "tpu_ops.train.reference:main"
    checkpoint_subdir: str = ""
    dataset_manifest: str | None = None
    hyperparameters: dict[str, Any] = field(default_factory=dict)
    heartbeat_s: float = 5.0
    term_grace_s: float = 30.0
    coordinator_port: int = 8476
    # Run on each VM before the trainer's first start (and after every recreate: a fresh disk).
    setup: list[str] | None = None
    # The interpreter for a ``trainer`` entry point (e.g. a venv the setup made); default: the agent's.
    python: str | None = None
    # On SIGTERM, write RUN/_tpu_ops/notices/worker-N.json at once, so the supervisor recovers early.
    preemption_notice: bool = True
    incarnation: str = ""  # written by the supervisor before it asks for the slice
    slices: int = 1  # the allocation's slice count: above 1, agents wait for ALLOCATION_DOC of their incarnation
    goodput: dict[str, Any] = field(default_factory=dict)  # step records, Cloud Logging (agent.goodput_hooks)
    # Elastic shapes (docs/elastic.md): the target shape and its chips; set, agents wait for ALLOCATION_DOC
    # (which names the live shape and its chips) whatever the slice count, and set TPU_OPS_ACCUM_STEPS.
    target_shape: str = ""
    target_chips: int = 0
    # A run that may move at a checkpoint (docs/moves.md): a single slice's workers also obey the stop marker.
    movable: bool = False

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Job:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in doc.items() if k in known})

    @property
    def steps_uri(self) -> str:
        """The directory holding ``<step>/`` entries."""
        return join(self.run_uri, self.checkpoint_subdir) if self.checkpoint_subdir else self.run_uri.rstrip("/")

    def paths(self, job_uri: str) -> RunPaths:
        """The run's paths; its state lives beside the job document (``job_uri``'s directory)."""
        return RunPaths(self.run_uri, self.checkpoint_subdir, job_uri.rstrip("/").rsplit("/", 1)[0])

    def argv(self, workdir: Path | None = None) -> list[str]:
        if self.command:
            return list(self.command)
        return [self.interpreter(workdir), "-c", ENTRY, self.trainer]

    def interpreter(self, workdir: Path | None = None) -> str:
        """The trainer's Python: ``python`` (relative to the worker directory), else the agent's own."""
        if not self.python:
            return sys.executable
        path = Path(self.python)
        return str(path if path.is_absolute() or workdir is None or "/" not in self.python else workdir / path)


@dataclass(frozen=True)
class RunPaths:
    """A run's GCS paths (what ``tpu_ops.layout.RunLayout`` names): the steps, and the run's state
    directory, which is where the job document is (the agent never spells its name)."""

    run_uri: str
    checkpoint_subdir: str
    state_uri: str

    @property
    def bucket(self) -> str:
        return split_gs(self.run_uri)[0]

    def state(self, relative: str) -> str:
        """The object key of ``<state>/<relative>`` (``RUN/_tpu_ops/<relative>``)."""
        return join(split_gs(self.state_uri)[1], relative)

    @property
    def done(self) -> str:
        return self.state("DONE")

    def heartbeat(self, worker: int, slice_index: int = 0) -> str:
        return self.state(f"heartbeats/{host_key(slice_index, worker)}.json")

    def worker_report(self, worker: int, slice_index: int = 0) -> str:
        return self.state(f"workers/{host_key(slice_index, worker)}.json")

    @property
    def allocation(self) -> str:
        return self.state(ALLOCATION_DOC)

    def log_chunk(self, incarnation: str, worker: int, offset: int, at_ms: int, slice_index: int = 0) -> str:
        """One piece of a trainer's output (``RunLayout.logs``): its byte offset, then when it was shipped."""
        return self.state(f"logs/{incarnation}/{host_key(slice_index, worker)}/{offset:012d}-{at_ms}.log")

    def notice(self, worker: int, slice_index: int = 0) -> str:
        return self.state(f"notices/{host_key(slice_index, worker)}.json")

    def standby(self, incarnation: str, worker: int, slice_index: int = 0) -> str:
        """A move's new worker heartbeats here until admitted (the live workers' heartbeats stay theirs)."""
        return self.state(f"standby/{incarnation}/{host_key(slice_index, worker)}.json")


def host_key(slice_index: int, worker: int) -> str:
    """A host's name in the run's state paths: ``worker-N`` on slice 0 (as ever), else ``slice-S-worker-N``."""
    return f"worker-{worker}" if slice_index == 0 else f"slice-{slice_index}-worker-{worker}"


MEGASCALE_PORT = 8080  # the port JAX's multislice runtime listens on (its default)
ALLOCATION_DOC = "allocation.json"  # RUN/_tpu_ops/allocation.json: the live allocation (supervisor writes)
# Metadata of a move's new slice (docs/moves.md): its agents wait until ALLOCATION_DOC names their incarnation.
STANDBY_KEY = "tpu-ops-standby"


@dataclass(frozen=True)
class Placement:
    """Where one worker is in the run's allocation, computed from the *live* allocation each time the
    workers start (never remembered): its slice, its host in that slice, and every live slice's hosts.

    Process ids run over all hosts of all slices in slice order: slice ``s`` host ``h`` is
    ``sum(hosts of slices < s) + h`` (``s * hosts + h`` when the slices are alike). One slice: the
    process id is the worker number, as before multislice.
    """

    slice: int
    host: int
    slices: tuple[tuple[str, ...], ...]  # per live slice (in slice order), its hosts' addresses in worker order

    @property
    def process_id(self) -> int:
        return sum(len(s) for s in self.slices[: self.slice]) + self.host

    @property
    def processes(self) -> int:
        return sum(len(s) for s in self.slices)

    def coordinator(self, port: int) -> str:
        """Slice 0 host 0, ``host:port`` (jax.distributed's coordinator and multislice's)."""
        first = self.slices[0][0] if self.slices and self.slices[0] else "127.0.0.1"
        return f"{first}:{port}"


def placement(who: WorkerIdentity, slice_index: int = 0, allocation: Mapping[str, Any] | None = None) -> Placement:
    """This worker's placement: from the allocation document (``{"slices": [{"index", "endpoints"}, ...]}``,
    see :func:`allocation_doc`) when the run has one, else its own slice alone."""
    if not allocation:
        return Placement(0, who.worker_number, (tuple(who.endpoints) or ("127.0.0.1",),))
    ordered = sorted(allocation["slices"], key=lambda s: int(s["index"]))
    if [int(s["index"]) for s in ordered] != list(range(len(ordered))) or not 0 <= slice_index < len(ordered):
        raise ContractError(f"allocation slices {[s['index'] for s in ordered]} do not hold slice {slice_index}")
    return Placement(slice_index, who.worker_number, tuple(tuple(s["endpoints"]) for s in ordered))


def allocation_doc(incarnation: str, slices: list[tuple[str, list[str]]], port: int = MEGASCALE_PORT) -> dict[str, Any]:
    """What the supervisor writes to ``RUN/_tpu_ops/allocation.json`` once every slice of an allocation is up:
    per slice (in index order) its id and its hosts' addresses; agents of that incarnation wait for it."""
    return {"incarnation": incarnation, "megascale_port": port,
            "slices": [{"index": i, "id": sid, "hosts": len(eps), "endpoints": list(eps)}
                       for i, (sid, eps) in enumerate(slices)]}  # fmt: skip


def shape_env(job: Job, allocation: Mapping[str, Any] | None) -> dict[str, str]:
    """The elastic-shape variables (docs/elastic.md), from the live allocation document's ``shape``/``chips``:
    the trainer accumulates ``TPU_OPS_ACCUM_STEPS`` micro-batches so its step is the target shape's.
    Empty for a run without shapes (or before a supervisor that writes them)."""
    if not job.target_shape or not allocation or not allocation.get("chips"):
        return {}
    chips, target = int(allocation["chips"]), int(job.target_chips)
    if chips <= 0 or target % chips:
        raise ContractError(f"allocation of {chips} chips does not divide the target's {target} (no accumulation)")
    return {
        "TPU_OPS_ACCUM_STEPS": str(target // chips),
        "TPU_OPS_CHIPS": str(chips),
        "TPU_OPS_TARGET_CHIPS": str(target),
        "TPU_OPS_SHAPE": str(allocation.get("shape") or ""),
        "TPU_OPS_TARGET_SHAPE": job.target_shape,
    }


def coordinator(job: Job, who: WorkerIdentity) -> str:
    return f"{who.endpoints[0] if who.endpoints else '127.0.0.1'}:{job.coordinator_port}"


def contract_env(
    job: Job,
    who: WorkerIdentity,
    resume: int | None,
    progress: Path,
    incarnation: str = "",
    where: Placement | None = None,
    megascale_port: int = MEGASCALE_PORT,
) -> dict[str, str]:
    """The job contract's variables for one worker (docs/architecture.md, "The job contract").

    ``TPU_OPS_WORKER``/``TPU_OPS_WORKERS`` stay the host within its slice; ``TPU_OPS_PROCESS_ID``/
    ``TPU_OPS_PROCESSES`` (and ``JAX_*``) count every host of every live slice; the ``MEGASCALE_*``
    variables are set only when the allocation has more than one slice.
    """
    where = where or placement(who)
    coord = where.coordinator(job.coordinator_port)
    env = {
        "TPU_OPS_RUN_ID": job.run_id,
        "TPU_OPS_WORKER": str(who.worker_number),
        "TPU_OPS_WORKERS": str(who.worker_count),
        "TPU_OPS_SLICE": str(where.slice),
        "TPU_OPS_SLICES": str(len(where.slices)),
        "TPU_OPS_PROCESS_ID": str(where.process_id),
        "TPU_OPS_PROCESSES": str(where.processes),
        "TPU_OPS_CHECKPOINT_DIR": job.steps_uri,
        "TPU_OPS_STEPS": str(job.steps),
        "TPU_OPS_CHECKPOINT_EVERY": str(job.checkpoint_every),
        "TPU_OPS_HYPERPARAMETERS": json.dumps(job.hyperparameters, sort_keys=True),
        "TPU_OPS_PROGRESS_FILE": str(progress),
        "TPU_OPS_TERM_GRACE_S": f"{job.term_grace_s:g}",
        "TPU_OPS_INCARNATION": incarnation,
        "TPU_OPS_COORDINATOR_ADDRESS": coord,
        "JAX_COORDINATOR_ADDRESS": coord,
        "JAX_NUM_PROCESSES": str(where.processes),
        "JAX_PROCESS_ID": str(where.process_id),
        # GKE-style names other frameworks read
        "TPU_WORKER_ID": str(who.worker_number),
        "TPU_WORKER_HOSTNAMES": ",".join(who.endpoints),
    }
    if len(where.slices) > 1:  # JAX's multislice runtime (DCN between slices)
        env.update({
            "MEGASCALE_COORDINATOR_ADDRESS": where.coordinator(megascale_port),
            "MEGASCALE_NUM_SLICES": str(len(where.slices)),
            "MEGASCALE_SLICE_ID": str(where.slice),
            "MEGASCALE_PORT": str(megascale_port),
        })  # fmt: skip
    if resume is not None:
        env["TPU_OPS_RESUME_STEP"] = str(resume)
    if job.dataset_manifest:
        env["TPU_OPS_DATASET_MANIFEST"] = job.dataset_manifest
    return env


@dataclass(frozen=True)
class JobEnv:
    """The job contract as a trainer reads it (``job_env()``): the ``TPU_OPS_*`` variables the agent sets."""

    run_id: str
    worker: int
    workers: int
    checkpoint_dir: str
    steps: int
    checkpoint_every: int
    resume_step: int | None = None
    dataset_manifest: str | None = None
    hyperparameters: dict[str, Any] = field(default_factory=dict)
    progress_file: Path | None = None
    coordinator_address: str | None = None
    term_grace_s: float = 30.0
    incarnation: str = ""
    step_log: Path | None = None  # the trainer appends its step/save/restore records here (goodput)
    slice: int = 0  # this worker's slice, of ``slices`` (multislice)
    slices: int = 1
    process_id: int = -1  # over every host of every slice; -1 (unset): ``worker``
    processes: int = 0  # 0 (unset): ``workers``
    # Elastic shapes: micro-batches per optimizer step (target chips / chips), so the global batch is kept
    accum_steps: int = 1
    chips: int = 0  # chips of the current allocation; 0: unknown
    target_chips: int = 0
    shape: str = ""  # accelerator types, e.g. v5p-16 (current) and v5p-32 (target); "": unknown
    target_shape: str = ""

    def __post_init__(self) -> None:
        if self.process_id < 0:  # one slice: a process is a worker
            object.__setattr__(self, "process_id", self.worker)
        if self.processes <= 0:
            object.__setattr__(self, "processes", self.workers)


class ContractError(ValueError):
    """A job-contract variable is missing or malformed (names the variable)."""


def job_env(env: Mapping[str, str] | None = None) -> JobEnv:
    """Read and check the job contract from ``env`` (default: this process's environment)."""
    env = os.environ if env is None else env

    def need(name: str) -> str:
        value = env.get("TPU_OPS_" + name)
        if value is None or value == "":
            raise ContractError(f"TPU_OPS_{name} is not set (the agent sets it; docs/training.md)")
        return value

    def number(name: str, default: str | None = None, low: int = 0) -> int:
        raw = env.get("TPU_OPS_" + name) or default
        try:
            value = int(raw if raw is not None else need(name))
        except ValueError:
            raise ContractError(f"TPU_OPS_{name}={raw!r} is not an integer") from None
        if value < low:
            raise ContractError(f"TPU_OPS_{name}={value} is below {low}")
        return value

    hp = json.loads(env.get("TPU_OPS_HYPERPARAMETERS") or "{}")
    if not isinstance(hp, dict):
        raise ContractError("TPU_OPS_HYPERPARAMETERS is not a JSON object")
    progress = env.get("TPU_OPS_PROGRESS_FILE")
    step_log = env.get("TPU_OPS_STEP_LOG")
    resume = env.get("TPU_OPS_RESUME_STEP")
    return JobEnv(
        run_id=need("RUN_ID"), worker=number("WORKER", "0"), workers=number("WORKERS", "1", low=1),
        checkpoint_dir=need("CHECKPOINT_DIR"), steps=number("STEPS", low=1),
        checkpoint_every=number("CHECKPOINT_EVERY", low=1),
        resume_step=number("RESUME_STEP") if resume else None,
        dataset_manifest=env.get("TPU_OPS_DATASET_MANIFEST") or None, hyperparameters=hp,
        progress_file=Path(progress) if progress else None,
        coordinator_address=env.get("TPU_OPS_COORDINATOR_ADDRESS") or None,
        term_grace_s=float(env.get("TPU_OPS_TERM_GRACE_S") or 30.0), incarnation=env.get("TPU_OPS_INCARNATION") or "",
        step_log=Path(step_log) if step_log else None, slice=number("SLICE", "0"), slices=number("SLICES", "1", low=1),
        process_id=number("PROCESS_ID", "-1", low=-1), processes=number("PROCESSES", "0"),
        accum_steps=number("ACCUM_STEPS", "1", low=1), chips=number("CHIPS", "0"),
        target_chips=number("TARGET_CHIPS", "0"), shape=env.get("TPU_OPS_SHAPE") or "",
        target_shape=env.get("TPU_OPS_TARGET_SHAPE") or "",
    )  # fmt: skip
