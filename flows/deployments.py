"""Deployments: ``tpu-ops serve`` (or ``python -m flows.deployments``) serves them to a Prefect API.

Served: the retraining pipeline (on its spec's cron schedule when a spec is given), the mirror,
``provision-slice`` and ``run-on-slice`` for the UI's forms and ``run_deployment``, the reaper
every 15 minutes, and the audit trail's seal every ``audit_seal_interval_s`` (hourly by default).
In production, ``deploy`` the same objects to a work pool instead.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from datetime import timedelta
from types import FrameType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tpu_ops.specs import PipelineSpec

REAP_INTERVAL = timedelta(minutes=15)
SHUTDOWN_GRACE_S = 20.0


def reaper_name(interval: timedelta) -> str:
    """The reaper deployment's name, which says how often it runs."""
    if interval == REAP_INTERVAL:
        return "every-15-minutes"
    return f"every-{int(interval.total_seconds())}s"


def deployments(pipeline: PipelineSpec | None = None, reap_interval: timedelta = REAP_INTERVAL) -> list[Any]:
    """The ``RunnerDeployment`` objects (built lazily: importing this module starts nothing).

    With ``pipeline``, the retraining deployment is named after it, takes it as default
    parameters and runs on its ``schedule`` (cron, UTC) if it has one. The reaper runs every
    ``reap_interval``.
    """
    from flows.mirror import mirror_dataset
    from flows.pipeline import retraining_pipeline
    from flows.provision import provision_slice, run_on_slice
    from flows.reaper import reap_tpu_slices
    from flows.seal import seal_audit_trail
    from flows.train import train
    from tpu_ops.settings import Settings

    retrain: dict[str, Any] = {"name": "default", "tags": ["tpu-ops", "pipeline"]}
    if pipeline is not None:
        retrain.update(name=pipeline.name, parameters={"spec": pipeline.model_dump(mode="json")})
        if pipeline.schedule:
            retrain["cron"] = pipeline.schedule
    served = [
        retraining_pipeline.to_deployment(**retrain),
        mirror_dataset.to_deployment(name="default", tags=["tpu-ops", "mirror"]),
        provision_slice.to_deployment(name="default", tags=["tpu-ops"]),
        run_on_slice.to_deployment(name="default", tags=["tpu-ops"]),
        train.to_deployment(name="default", tags=["tpu-ops", "train"]),
        reap_tpu_slices.to_deployment(
            name=reaper_name(reap_interval),
            interval=reap_interval,
            parameters={"ttl_hours": 72.0},
            tags=["tpu-ops", "reaper"],
        ),
    ]
    seal_every = Settings().audit_seal_interval_s
    if seal_every:  # a digest even when nothing happened: verify detects a cut-off trail within one interval
        served.append(
            seal_audit_trail.to_deployment(
                name=f"every-{seal_every}s", interval=timedelta(seconds=seal_every), tags=["tpu-ops", "audit"]
            )
        )
    return served


def _arm_shutdown_deadline(grace_s: float) -> None:
    """Leave with exit code 1 if the process is still shutting down ``grace_s`` seconds from now."""

    def give_up() -> None:
        print(
            f"error: shutdown did not finish within {grace_s:.0f} s (is the Prefect API gone?); exiting",
            file=sys.stderr,
            flush=True,
        )
        os._exit(1)

    timer = threading.Timer(grace_s, give_up)
    timer.daemon = True
    timer.start()


def main(
    pipeline: PipelineSpec | None = None, grace_s: float = SHUTDOWN_GRACE_S, reap_interval: timedelta = REAP_INTERVAL
) -> None:
    """Serve every deployment until SIGTERM or SIGINT; shutdown takes at most ``grace_s`` seconds.

    Prefect's runner pauses every deployment's schedule as it shuts down, retrying against the API
    for minutes when the API has gone; a deadline armed by the signal bounds that.
    """
    import asyncio

    from prefect.exceptions import TerminationSignal
    from prefect.runner import Runner

    served = deployments(pipeline, reap_interval)

    class BoundedRunner(Runner):
        async def __aenter__(self) -> BoundedRunner:
            await super().__aenter__()
            names = ", ".join(f"{d.flow_name}/{d.name}" for d in served)
            print(f"serving {names}; stop with Ctrl-C", flush=True)  # ready: a signal now shuts down cleanly
            return self

        def handle_sigterm(self, *args: Any, **kwargs: Any) -> None:
            # Prefect's own handler calls ``stop()`` from inside the loop, where it only makes the
            # ``astop`` coroutine ("never awaited") and exits mid-loop; schedule ``astop`` on the loop instead.
            _arm_shutdown_deadline(grace_s)
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # not serving yet: leave the way SIGINT does
                raise KeyboardInterrupt from None
            if not self.started:
                raise KeyboardInterrupt
            print("SIGTERM: stopping (pausing the schedules)", flush=True)
            self._stopping_task = loop.create_task(self.astop())  # kept: the loop holds tasks weakly

    def on_sigint(signum: int, frame: FrameType | None) -> None:
        _arm_shutdown_deadline(grace_s)
        raise KeyboardInterrupt

    runner = BoundedRunner(pause_on_shutdown=True)
    for deployment in served:
        runner.add_deployment(deployment)
    signal.signal(signal.SIGINT, on_sigint)
    with contextlib.suppress(KeyboardInterrupt, TerminationSignal):  # the way out, as in prefect.serve
        asyncio.run(runner.start())


if __name__ == "__main__":  # pragma: no cover
    main()
