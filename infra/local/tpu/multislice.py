"""Multislice queued resources of the fake TPU API: one request, ``nodeCount`` nodes, Google's repair.

A node spec names either one node (``nodeId``) or, with ``multisliceParams`` {``nodeCount`` > 1,
``nodeIdPrefix`` (default: the queued resource's id)}, ``nodeCount`` nodes ``prefix-0`` ..
``prefix-{n-1}`` granted together or not at all. Each node's VMs see ``MEGASCALE_NUM_SLICES``,
``MEGASCALE_SLICE_ID`` and ``MEGASCALE_COORDINATOR_ADDRESS`` (slice 0's worker 0) in ``tpu-env``.

Repair, as Google's multislice page says: when one node is preempted its VMs go, a new node of the same
name is created (waiting for capacity if there is none) and, once it is READY, every other node's VMs
are restarted. The queued resource stays ACTIVE meanwhile (an assumption of the fake: Google's page
describes the repair, not the state it shows); ``Latency.repair_s`` is how long Google takes to start it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Final

from infra.local.core import exceptions as exc

PREFIX_RE: Final = re.compile(r"^[A-Za-z0-9.~+%-]+$")  # MultisliceParams.nodeIdPrefix, as documented
MEGASCALE_PORT: Final = 8080


@dataclass(frozen=True)
class Planned:
    """One node a queued resource asks for: its id, its body, and its place in a multislice request."""

    node_id: str
    body: dict[str, Any]
    slice_index: int = 0
    slices: int = 1  # above 1: a node of a multislice request


def expand(qr_id: str, specs: list[dict[str, Any]]) -> list[Planned]:
    """The nodes ``specs`` ask for; ``InvalidArgument`` as Google's validation would say it."""
    out: list[Planned] = []
    for s in specs:
        ms = s.get("multisliceParams")
        if ("nodeId" in s) == (ms is not None):
            raise exc.InvalidArgument("nodeSpec needs exactly one of nodeId and multisliceParams")
        if ms is None:
            out.append(Planned(str(s["nodeId"]), dict(s.get("node", {}))))
            continue
        try:
            count = int(ms.get("nodeCount", 0))
        except (TypeError, ValueError):
            count = 0
        if count <= 1:
            raise exc.InvalidArgument(f"multisliceParams.nodeCount must be > 1, not {ms.get('nodeCount')!r}")
        prefix = str(ms.get("nodeIdPrefix") or qr_id)
        if not PREFIX_RE.match(prefix):
            raise exc.InvalidArgument(f"multisliceParams.nodeIdPrefix {prefix!r} must match {PREFIX_RE.pattern}")
        out += [Planned(f"{prefix}-{i}", dict(s.get("node", {})), i, count) for i in range(count)]
    return out


def megascale_env(slice_index: int, slices: int, coordinator_ip: str) -> dict[str, str]:
    """The ``tpu-env`` lines a multislice node's VMs get."""
    return {
        "MEGASCALE_NUM_SLICES": str(slices),
        "MEGASCALE_SLICE_ID": str(slice_index),
        "MEGASCALE_COORDINATOR_ADDRESS": f"{coordinator_ip}:{MEGASCALE_PORT}",
    }
