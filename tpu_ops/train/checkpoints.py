"""The checkpoint finder: the newest *complete* Orbax step of a run, from one GCS listing.

Layout (Orbax on GCS): ``RUN/<step>/...``; a step is complete only when
``RUN/<step>/commit_success.txt`` exists, because Orbax writes that file last. What is *not* a
complete step, and is ignored here:

- a step directory without its marker (a save interrupted by a preemption);
- item-level markers (``RUN/<step>/<item>/commit_success.txt``): Orbax writes one per item, and an
  interrupted save can already hold some of them;
- Orbax's local temporary names (``<step>.orbax-checkpoint-tmp``, with or without a suffix) and any
  other entry whose whole name is not an integer (``_tpu_ops/``, ``metadata/``, ``export/``).

A MaxText run keeps its steps one level deeper (``<base>/<run_name>/checkpoints/<step>``): pass
that directory as ``run_uri``.
"""

from __future__ import annotations

import re
from typing import Any

from tpu_ops.cloud.translate import google_errors
from tpu_ops.uris import parse_gs

COMMIT_MARKER = "commit_success.txt"
_STEP = re.compile(r"[0-9]+")
_GLOB_SPECIAL = re.compile(r"[\\*?\[\]{}]")


def step_uri(run_uri: str, step: int) -> str:
    """``gs://…/RUN/<step>``: where step ``step`` of the run lives."""
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    return str(parse_gs(run_uri).child(str(step)))


def complete_steps(gcs: Any, run_uri: str) -> list[int]:
    """Every complete step of the run, ascending, from a single listing.

    The listing asks for ``RUN/*/commit_success.txt`` with ``match_glob`` (so real GCS returns
    one object per step, whatever each step holds) and filters the names again here, because an
    emulator may ignore the glob and return the whole prefix.
    """
    run = parse_gs(run_uri)
    head = f"{run.prefix}/" if run.prefix else ""
    kw: dict[str, Any] = {"prefix": head or None}
    if not _GLOB_SPECIAL.search(head):
        kw["match_glob"] = f"{head}*/{COMMIT_MARKER}"
    steps: set[int] = set()
    with google_errors("gcs"):
        for blob in gcs.list_blobs(run.bucket, **kw):
            rest = blob.name[len(head) :]
            name, sep, marker = rest.partition("/")
            if sep and marker == COMMIT_MARKER and _STEP.fullmatch(name):
                steps.add(int(name))
    return sorted(steps)


def latest_complete_step(gcs: Any, run_uri: str) -> int | None:
    """The newest step whose ``<step>/commit_success.txt`` exists, or None if there is none."""
    steps = complete_steps(gcs, run_uri)
    return steps[-1] if steps else None
