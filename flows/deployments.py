"""Deployments: ``tpu-ops serve`` (or ``python -m flows.deployments``) serves them to a Prefect API.

Served: the retraining pipeline (on its spec's cron schedule when a spec is given), the mirror,
``provision-slice`` and ``run-on-slice`` for the UI's forms and ``run_deployment``, and the reaper
every 15 minutes. In production, ``deploy`` the same objects to a work pool instead.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tpu_ops.specs import PipelineSpec

REAP_INTERVAL = timedelta(minutes=15)


def deployments(pipeline: PipelineSpec | None = None) -> list[Any]:
    """The ``RunnerDeployment`` objects (built lazily: importing this module starts nothing).

    With ``pipeline``, the retraining deployment is named after it, takes it as default
    parameters and runs on its ``schedule`` (cron, UTC) if it has one.
    """
    from flows.mirror import mirror_dataset
    from flows.pipeline import retraining_pipeline
    from flows.provision import provision_slice, run_on_slice
    from flows.reaper import reap_tpu_slices

    retrain: dict[str, Any] = {"name": "default", "tags": ["tpu-ops", "pipeline"]}
    if pipeline is not None:
        retrain.update(name=pipeline.name, parameters={"spec": pipeline.model_dump(mode="json")})
        if pipeline.schedule:
            retrain["cron"] = pipeline.schedule
    return [
        retraining_pipeline.to_deployment(**retrain),
        mirror_dataset.to_deployment(name="default", tags=["tpu-ops", "mirror"]),
        provision_slice.to_deployment(name="default", tags=["tpu-ops"]),
        run_on_slice.to_deployment(name="default", tags=["tpu-ops"]),
        reap_tpu_slices.to_deployment(
            name="every-15-minutes", interval=REAP_INTERVAL, parameters={"ttl_hours": 72.0}, tags=["tpu-ops", "reaper"]
        ),
    ]


def main(pipeline: PipelineSpec | None = None) -> None:  # pragma: no cover - a long-running server
    """Serve every deployment until interrupted."""
    from prefect import serve

    serve(*deployments(pipeline))


if __name__ == "__main__":  # pragma: no cover
    main()
