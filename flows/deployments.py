"""Deployments of the provisioning flows: ``python -m flows.deployments`` serves them locally.

The reaper runs every 15 minutes; ``run-on-slice`` and ``provision-slice`` are served for the UI
and for ``run_deployment``. In production, ``deploy`` the same objects to a work pool instead.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

REAP_INTERVAL = timedelta(minutes=15)


def deployments() -> list[Any]:
    """The ``RunnerDeployment`` objects (built lazily: importing this module starts nothing)."""
    from flows.provision import provision_slice, run_on_slice
    from flows.reaper import reap_tpu_slices

    return [
        reap_tpu_slices.to_deployment(
            name="every-15-minutes", interval=REAP_INTERVAL, parameters={"ttl_hours": 72.0}, tags=["tpu-ops", "reaper"]
        ),
        provision_slice.to_deployment(name="default", tags=["tpu-ops"]),
        run_on_slice.to_deployment(name="default", tags=["tpu-ops"]),
    ]


def main() -> None:  # pragma: no cover - a long-running server
    from prefect import serve

    serve(*deployments())


if __name__ == "__main__":  # pragma: no cover
    main()
