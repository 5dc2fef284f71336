"""The fake's read-only directory: the zones it serves (``locations``) and its TPU reservations.

``GET /v2/projects/{p}/locations`` is Cloud TPU v2's locations list (what ``TpuClient.list_locations``
calls); ``GET /v2alpha1/projects/{p}/locations/{zone}/reservations`` is the v2alpha1 reservations
list (v2 has none), answered from the fake's configured capacity so ``tpu-ops doctor`` can check
that a spec's named reservations exist.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from infra.local.core import exceptions as exc
from infra.local.tpu.core import split_parent

if TYPE_CHECKING:
    from infra.local.tpu.models import TpuBackend

# Zones that offer Cloud TPU (as documented in Nov 2026); zones configured in the fake's capacity are added.
TPU_ZONES = (
    "asia-east1-c", "asia-northeast1-b", "asia-southeast1-b", "europe-west4-a", "europe-west4-b",
    "us-central1-a", "us-central1-b", "us-central1-c", "us-central1-f", "us-central2-b", "us-east1-c",
    "us-east1-d", "us-east5-a", "us-east5-b", "us-east5-c", "us-south1-a", "us-west1-c", "us-west4-a",
    "us-west4-b",
)  # fmt: skip


def list_locations(backend: TpuBackend, project_path: str) -> dict[str, Any]:
    """``{"locations": [{"name", "locationId"}]}`` for ``projects/{p}``."""
    parts = project_path.split("/")
    if len(parts) != 2 or parts[0] != "projects" or not parts[1]:
        raise exc.InvalidArgument(f"invalid name {project_path!r}")

    def run() -> dict[str, Any]:
        zones = sorted(set(TPU_ZONES) | set(backend.capacity.zones))
        return {"locations": [{"name": f"{project_path}/locations/{z}", "locationId": z} for z in zones]}

    return backend._call("GET", f"/v2/{project_path}/locations", run)


def list_reservations(backend: TpuBackend, parent: str) -> dict[str, Any]:
    """The reservations of a zone, v2alpha1-shaped: size in chips, usage, ``APPROVED``."""
    _, zone = split_parent(parent)

    def run() -> dict[str, Any]:
        sizes = backend.capacity.zone(zone).reservations
        return {
            "reservations": [
                {"name": f"{parent}/reservations/{name}", "standard": {"size": chips}, "state": "APPROVED"}
                for name, chips in sorted(sizes.items())
            ]
        }

    return backend._call("GET", f"/v2alpha1/{parent}/reservations", run)
