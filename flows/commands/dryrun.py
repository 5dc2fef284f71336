"""``tpu-ops dry-run``: the whole pipeline, locally, against emulated clouds — the same code path."""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

DEFAULT_SPEC = Path(__file__).resolve().parents[1] / "dryrun.yaml"


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "dry-run",
        help="Run the whole pipeline locally against emulated clouds (starts and stops them).",
        description="Starts the local stack (moto, fake-gcs-server, fake Cloud TPU API, TPU-VM host "
        "simulator), seeds a curated dataset, and runs the retraining-pipeline flow on it. Uses a "
        "temporary Prefect server unless PREFECT_API_URL points at one (e.g. `make ui`).",
    )
    p.add_argument("--spec", type=Path, default=DEFAULT_SPEC, help="pipeline spec (default: the shipped one)")
    p.add_argument("--run-id", help="run id (default: derived from the spec's name and the time)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--workdir", type=Path, default=Path(".tpu-ops/dry-run"), help="where workers' files go")
    p.set_defaults(handler=run)


def _step(text: str) -> None:
    print(f"==> {text}", flush=True)


def run(args: argparse.Namespace) -> int:
    from tpu_ops.specs import PipelineSpec, load_spec

    spec = load_spec(args.spec, PipelineSpec)  # bad input fails here, before anything starts
    # A temporary Prefect server must not try to phone home from a machine with no network.
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # moto's per-request lines
    from infra.local.seed import DRY_RUN_CAPACITY, seed_pipeline
    from infra.local.stack import LocalStack

    started = time.monotonic()
    args.workdir.mkdir(parents=True, exist_ok=True)
    _step("starting the local stack (moto, fake-gcs-server, fake Cloud TPU API, host simulator)")
    with LocalStack(workdir=args.workdir.resolve() / "workers", grace_s=2.0) as stack:
        # The flows read Settings from the environment, exactly as a deployment would.
        os.environ.update(stack.env())
        os.environ["TPU_OPS_STATE_DIR"] = str(args.workdir.resolve() / "state")
        os.environ.setdefault("TPU_OPS_POLL_INTERVAL_S", "0.2")
        settings = stack.settings()
        _step(f"seeding a curated dataset in {spec.mirror.source}")
        seeded = seed_pipeline(settings, spec)
        stack.set_capacity(DRY_RUN_CAPACITY)
        print(
            f"    {seeded.shards} shards, {seeded.bytes / 2**20:.1f} MiB; TPU capacity: {json.dumps(DRY_RUN_CAPACITY)}"
        )

        _step("running the retraining-pipeline flow")
        from flows.pipeline import retraining_pipeline

        summary: dict[str, Any] = retraining_pipeline(spec, run_id=args.run_id)
        left = stack.state()
        leftover = int(left["queued_resources"]) + int(left["nodes"])
        summary["left_behind"] = {"tpu_resources": leftover, "worker_processes": len(left.get("worker_pids", []))}
    summary["seconds"] = round(time.monotonic() - started, 1)
    if args.json:
        print(json.dumps(summary, indent=2, default=str))
    else:
        _step("done")
        for key in ("run_id", "snapshot_id", "manifest", "objects_copied", "slice", "workers_verified", "cost"):
            print(f"    {key}: {summary[key]}")
        print("    ladder:")
        for attempt in summary["attempts"]:
            print(f"      {attempt}")
        print(f"    left behind: {summary['left_behind']}; took {summary['seconds']} s")
    return 0 if leftover == 0 else 1
