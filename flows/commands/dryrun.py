"""``tpu-ops dry-run``: the whole pipeline, locally, against emulated clouds — the same code path."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any, TextIO

TPU_API_SPEC = Path(__file__).resolve().parents[1] / "dryrun.yaml"  # v4-32 queued resources
COMPUTE_SPEC = Path(__file__).resolve().parents[1] / "dryrun-compute.yaml"  # a v5p-32 group of 4 hosts
DEFAULT_SPEC = TPU_API_SPEC  # what `local seed` seeds: the dataset is the same in both
SPECS = {"compute": COMPUTE_SPEC, "tpu-api": TPU_API_SPEC}
# The fake Compute Engine's capacity for the dry run: the reservation holds 2 of the 4 hosts, spot
# is stocked out in zone b, so the group comes from spot in zone c.
COMPUTE_CAPACITY: dict[str, Any] = {
    "us-east5-b": {
        "SPOT": 0,
        "reservations": {"fraud-v5p-reservation": {"count": 2, "machineType": "ct5p-hightpu-4t"}},
    },
    "us-east5-c": {"SPOT": 64},
}


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "dry-run",
        help="Run the whole pipeline locally against emulated clouds (starts and stops them).",
        description="Starts the local stack (moto, fake-gcs-server, fake Cloud TPU API, TPU-VM host "
        "simulator), seeds a curated dataset, and runs the retraining-pipeline flow on it. Uses a "
        "temporary Prefect server unless PREFECT_API_URL points at one (e.g. `make ui`).",
    )
    p.add_argument("--spec", type=Path, help="pipeline spec (default: the shipped one for the backend)")
    p.add_argument(
        "--backend",
        choices=sorted(SPECS),
        help="control plane: compute (default: a v5p-32 group on Compute Engine) or tpu-api (v4-32 queued "
        "resources); with --spec, overrides its slice.backend",
    )
    p.add_argument("--run-id", help="run id (default: derived from the spec's name and the time)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--workdir", type=Path, default=Path(".tpu-ops/dry-run"), help="where workers' files go")
    p.set_defaults(handler=run)


class PreemptOnce(threading.Thread):
    """Preempt the run's slice once, as spot capacity would: after its first committed checkpoint."""

    def __init__(self, stack: Any, settings: Any, spec: Any, run_id: str) -> None:
        super().__init__(name="preempt-once", daemon=True)
        from tpu_ops.provision.providers import for_spec

        self.provider = for_spec(spec.provision, settings)
        from tpu_ops.train.layout import RunLayout

        self.stack, self.settings, self.spec, self.run_id = stack, settings, spec, run_id
        self.layout = RunLayout.of(spec.train.checkpoint_dir, run_id, spec.train.checkpoint_subdir)
        self.preempted: str | None = None
        self._done = threading.Event()

    def run(self) -> None:
        from tpu_ops.cloud.clients import storage_client
        from tpu_ops.errors import TpuOpsError
        from tpu_ops.provision.providers import SliceState
        from tpu_ops.train.checkpoints import latest_complete_step

        gcs = storage_client(self.settings)
        while not self._done.wait(0.2):
            try:
                if latest_complete_step(gcs, self.layout.steps_uri) is None:
                    continue
                for rec in self.provider.slices(list(self.spec.provision.slice.zones), self.run_id):
                    if rec.state not in SliceState.RUNNING:
                        continue
                    if self.provider.name == "tpu-api":
                        self.stack.preempt(rec.zone, rec.slice_id)
                        self.preempted = f"{rec.slice_id} in {rec.zone}"
                    else:  # one host of the group: the whole slice is lost, and recreated whole
                        host = rec.hosts[-1].name.split(".")[0]
                        self.stack.preempt_instance(rec.zone, host)
                        self.preempted = f"host {host} of {rec.slice_id} in {rec.zone}"
                    print(f"==> injected a spot preemption of {self.preempted}", flush=True)
                    return
            except TpuOpsError:
                continue

    def stop(self) -> None:
        self._done.set()
        self.join(timeout=10)


def audit_verified(settings: Any) -> dict[str, Any]:
    """The dry run's audit trail checked end to end (chains, digests, signatures when a key is set)."""
    from tpu_ops.audit.store import S3Store
    from tpu_ops.audit.trail import audit_clients
    from tpu_ops.audit.verify import items_from_objects, verify
    from tpu_ops.uris import parse_s3

    s3, kms = audit_clients(settings)
    items = items_from_objects(S3Store(s3, parse_s3(settings.audit_uri), 1).read_all())
    trusted = (
        kms.describe_key(KeyId=settings.audit_kms_key_id)["KeyMetadata"]["Arn"] if settings.audit_kms_key_id else None
    )
    report = verify(items, kms if trusted else None, trusted)
    if not report.records:
        verdict = "no records"
    elif report.ok:
        verdict = "OK" + (", signatures checked" if report.signatures_checked else "")
    else:
        verdict = f"DAMAGED: {report.damage[0].describe()}"
    return {"verify": verdict, "records": report.records, "digests": report.digests, "ok": report.ok}


def _step(text: str) -> None:
    print(f"==> {text}", flush=True)


def _lineage(settings: Any, run_id: str) -> str:
    """The run's lineage as text: what `tpu-ops audit lineage RUN_ID` prints."""
    from flows.audit import trail_for
    from tpu_ops.audit.lineage import render
    from tpu_ops.cloud.clients import storage_client
    from tpu_ops.cloud.session import shared_client
    from tpu_ops.export.release import load_lineage

    sm, gcs = shared_client(settings, "sagemaker"), storage_client(settings)
    return render(load_lineage(run_id, sm=sm, gcs=gcs, trail=trail_for(settings)))


def run(args: argparse.Namespace) -> int:
    """The dry run; with ``--json`` its progress lines go to stderr and stdout holds only the JSON."""
    out = sys.stdout
    with contextlib.redirect_stdout(sys.stderr if args.json else sys.stdout):
        return _run(args, out)


def _run(args: argparse.Namespace, out: TextIO) -> int:
    from tpu_ops.specs import PipelineSpec, load_spec, parse_spec

    spec = load_spec(args.spec or SPECS[args.backend or "compute"], PipelineSpec)  # bad input fails here
    if args.backend and args.spec:
        doc = spec.model_dump(mode="json")
        doc["provision"]["slice"]["backend"] = args.backend
        spec = parse_spec(PipelineSpec, doc, what="--backend")
    # A temporary Prefect server must not try to phone home from a machine with no network.
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    # On a loaded machine the temporary server can take longer than Prefect's default 20 s to answer.
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "90")
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # moto's per-request lines
    from infra.local.seed import DRY_RUN_CAPACITY, ensure_model_bucket, seed_pipeline
    from infra.local.stack import LocalStack

    started = time.monotonic()
    args.workdir.mkdir(parents=True, exist_ok=True)
    backend = spec.provision.slice.resolved_backend
    _step("starting the local stack (moto, fake-gcs-server, fake Cloud TPU API, fake Compute Engine, host simulators)")
    with LocalStack(workdir=args.workdir.resolve() / "workers", grace_s=2.0) as stack:
        # The flows read Settings from the environment, exactly as a deployment would.
        os.environ.update(stack.env())
        os.environ["TPU_OPS_STATE_DIR"] = str(args.workdir.resolve() / "state")
        os.environ.setdefault("TPU_OPS_POLL_INTERVAL_S", "0.2")
        settings = stack.settings()
        _step(f"seeding a curated dataset in {spec.mirror.source}")
        seeded = seed_pipeline(settings, spec)
        ensure_model_bucket(settings, spec.export.destination)  # where the pipeline exports to
        stack.set_capacity(DRY_RUN_CAPACITY)
        stack.set_compute_capacity(COMPUTE_CAPACITY)
        capacity = COMPUTE_CAPACITY if backend == "compute" else DRY_RUN_CAPACITY
        print(f"    {seeded.shards} shards, {seeded.bytes / 2**20:.1f} MiB; TPU capacity: {json.dumps(capacity)}")
        print(f"    backend {backend}: {spec.provision.slice.backend_reason}")

        from flows.pipeline import new_run_id, retraining_pipeline

        run_id = args.run_id or spec.run_id or new_run_id(spec.name)
        # The run id travels in the spec (the flow has no second one), checked like any spec field.
        fixed = parse_spec(PipelineSpec, {**spec.model_dump(mode="json"), "run_id": run_id}, what="--run-id")
        _step(f"running the retraining-pipeline flow as run {run_id} (one spot preemption will be injected)")
        injector = PreemptOnce(stack, settings, spec, run_id)
        injector.start()
        try:
            summary: dict[str, Any] = retraining_pipeline(fixed)
        finally:
            injector.stop()
        summary["injected_preemption"] = injector.preempted
        _step("verifying the audit trail")
        summary["audit"] = audit_verified(settings)
        left = stack.state()
        ce = left.get("compute") or {}
        leftover = (
            int(left["queued_resources"])
            + int(left["nodes"])
            + sum(
                int(ce.get(k, 0))
                for k in ("instances", "instance_group_managers", "instance_templates", "resource_policies")
            )
        )
        summary["left_behind"] = {"tpu_resources": leftover, "worker_processes": len(left.get("worker_pids", []))}
        summary["lineage"] = _lineage(settings, run_id)
        summary["backend"] = backend.value
    summary["seconds"] = round(time.monotonic() - started, 1)
    if args.json:
        print(json.dumps(summary, indent=2, default=str), file=out)
    else:
        from flows.report import glance_rows, glance_text

        _step("done")
        print(glance_text(glance_rows(summary)), file=out)
    return 0 if leftover == 0 else 1
