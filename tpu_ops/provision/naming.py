"""Run naming: one run id names every queued resource, node and label a run creates.

Ids are derived from the run id and the attempt number so a re-run finds what an earlier process
created (``{run_id}-a{attempt}``), and labels make orphans findable by the reaper.
"""

from __future__ import annotations

import re
import time
from typing import Final

from tpu_ops.layout import check_run_id  # the one run-id rule

RUN_LABEL: Final = "tpu-ops-run"
MANAGED_LABEL: Final = "tpu-ops-managed"
CREATED_LABEL: Final = "tpu-ops-created"  # epoch seconds: label values cannot hold ':' or '.'
TIER_LABEL: Final = "tpu-ops-tier"
ATTEMPT_LABEL: Final = "tpu-ops-attempt"

_RESOURCE_ID = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


# Slice i of a multislice allocation numbers its attempts from i * SLICE_STRIDE + 1 (``{run_id}-a1001`` is
# slice 1's first): every id of the run keeps the one form ``{run_id}-a{n}`` that teardown and the reaper
# match, and no run id can be mistaken for another's (a ``-s1`` infix would make run ``x``'s slice 1 look
# like run ``x-s1``'s slice 0). A ladder has at most 10 rungs of 8 zones: far below the stride.
SLICE_STRIDE: Final = 1000


def resource_id(run_id: str, attempt: int, slice_index: int = 0) -> str:
    """The queued-resource (and node) id of ``attempt`` (1-based) of ``run_id``'s slice ``slice_index``."""
    check_run_id(run_id)
    if not 1 <= attempt < SLICE_STRIDE:
        raise ValueError(f"attempt must be in 1..{SLICE_STRIDE - 1}, not {attempt}")
    rid = f"{run_id}-a{slice_index * SLICE_STRIDE + attempt}"
    assert len(rid) <= 63 and _RESOURCE_ID.fullmatch(rid), rid
    return rid


def attempt_of(run_id: str, rid: str) -> int | None:
    """The attempt number if ``rid`` was derived from ``run_id``, else None."""
    m = re.fullmatch(re.escape(run_id) + r"-a([1-9][0-9]*)", rid)
    return int(m.group(1)) if m else None


def slice_of(run_id: str, rid: str) -> int | None:
    """Which slice of the run's allocation ``rid`` is (0 for a single-slice run), or None if not the run's."""
    n = attempt_of(run_id, rid)
    if n is not None:
        return n // SLICE_STRIDE
    part = multislice_node(rid)
    return part[1] if part and attempt_of(run_id, part[0]) is not None else None


def billed(run_id: str, kind: str, rid: str) -> bool:
    """True if the ledger bills ``rid`` (of resource ``kind``) as a slice of ``run_id``: a request, instance or
    group ``{run_id}-a{n}``, or a node of the run's multislice request (kind ``node``: a Compute Engine group's
    instances are named ``{group}-xxxx`` and are parts, never slices)."""
    return attempt_of(run_id, rid) is not None or (kind == "node" and slice_of(run_id, rid) is not None)


# On the Cloud TPU API an allocation of k > 1 slices is one queued resource ``{run_id}-a{n}`` whose nodes are
# ``{run_id}-a{n}-0`` .. ``-{k-1}`` (Google's multisliceParams with the request's id as prefix). A request id
# always ends in ``-a<digits>``, a node of one in ``-<digits>``: the two never look alike.
_NODE = re.compile(r"^(.+-a[0-9]+)-([0-9]+)$")


def multislice_node(rid: str) -> tuple[str, int] | None:
    """``(queued resource id, slice index)`` if ``rid`` names a node of a multislice request, else None."""
    m = _NODE.fullmatch(rid)
    return (m.group(1), int(m.group(2))) if m else None


def run_labels(run_id: str, tier: str, attempt: int, *, now: float | None = None) -> dict[str, str]:
    """The labels tpu-ops puts on every node it creates (no credentials, ever)."""
    created = int(time.time() if now is None else now)
    return {
        MANAGED_LABEL: "true",
        RUN_LABEL: check_run_id(run_id),
        CREATED_LABEL: str(created),
        TIER_LABEL: tier,
        ATTEMPT_LABEL: str(attempt),
    }


def belongs_to(run_id: str, rid: str, labels: dict[str, str] | None = None) -> bool:
    """True if a resource with id ``rid`` and ``labels`` was created for ``run_id``."""
    if labels and labels.get(RUN_LABEL) == run_id:
        return True
    return attempt_of(run_id, rid) is not None


def run_of(rid: str, labels: dict[str, str] | None) -> str | None:
    """The run a managed resource belongs to (its label), or None if not managed by tpu-ops."""
    if labels and labels.get(MANAGED_LABEL) == "true" and labels.get(RUN_LABEL):
        return labels[RUN_LABEL]
    return None


def created_at(labels: dict[str, str] | None) -> float | None:
    """The creation time recorded in the labels (epoch seconds), if any."""
    try:
        return float((labels or {})[CREATED_LABEL])
    except (KeyError, ValueError):
        return None
