"""The agent's checkpoint finder: the newest *complete* Orbax step of a run, from one GCS listing.

The same rules as the controller's ``tpu_ops.train.checkpoints`` (CLOUD-FACTS, "Checkpoints
(Orbax)"), on the standard-library client: a step is ``RUN/<step>/`` whose whole name is an
integer and which holds ``RUN/<step>/commit_success.txt`` (Orbax writes it last). Item-level
markers (``<step>/<item>/commit_success.txt``), ``<step>.orbax-checkpoint-tmp*`` directories,
``_tpu_ops/`` and ``metadata/`` are not steps.
"""

from __future__ import annotations

import re

from tpu_ops.agent.gcs import Gcs, split_gs
from tpu_ops.agent.job import COMMIT_MARKER

_STEP = re.compile(r"[0-9]+")
_GLOB_SPECIAL = re.compile(r"[\\*?\[\]{}]")


def complete_steps(gcs: Gcs, steps_uri: str) -> list[int]:
    """Every complete step under ``steps_uri``, ascending (``matchGlob`` asked, names filtered again)."""
    bucket, prefix = split_gs(steps_uri)
    head = f"{prefix}/" if prefix else ""
    glob = None if _GLOB_SPECIAL.search(head) else f"{head}*/{COMMIT_MARKER}"
    steps: set[int] = set()
    for item in gcs.list_objects(bucket, head, match_glob=glob):
        name, sep, marker = item["name"][len(head) :].partition("/")
        if sep and marker == COMMIT_MARKER and _STEP.fullmatch(name):
            steps.add(int(name))
    return sorted(steps)


def latest_complete_step(gcs: Gcs, steps_uri: str) -> int | None:
    """The newest step whose ``<step>/commit_success.txt`` exists, or None."""
    steps = complete_steps(gcs, steps_uri)
    return steps[-1] if steps else None
