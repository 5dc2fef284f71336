"""``tpu-ops dry-run``: the whole pipeline, locally, against emulated clouds — the same code path."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shlex
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
        description="Starts the local stack (moto, fake-gcs-server, fake Compute Engine and Cloud TPU APIs, "
        "TPU-VM host simulator), seeds a curated dataset, and runs the retraining-pipeline flow on it. Uses a "
        "temporary Prefect server, with its own Prefect home under WORKDIR (never ~/.prefect), unless "
        "PREFECT_API_URL points at one (e.g. `make ui`). Keeps the run's audit trail (JSONL), ledger, "
        "goodput report and lineage under WORKDIR/runs/RUN_ID and prints the commands that read them.",
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
    p.add_argument(
        "--workdir", type=Path, default=Path(".tpu-ops/dry-run"), help="where workers' files and the run's trail go"
    )
    p.add_argument(
        "--keep",
        action="store_true",
        help="keep the simulated workers' files (WORKDIR/workers: their venvs, logs; ~600 MB) for inspection",
    )
    p.set_defaults(handler=run)


class PreemptOnce(threading.Thread):
    """Preempt the run's slice once, as spot capacity would: after its first committed checkpoint."""

    def __init__(self, stack: Any, settings: Any, spec: Any, run_id: str) -> None:
        super().__init__(name="preempt-once", daemon=True)
        from tpu_ops.provision.providers import for_spec

        self.provider = for_spec(spec.provision, settings)
        from tpu_ops.layout import RunLayout

        self.stack, self.settings, self.spec, self.run_id = stack, settings, spec, run_id
        self.layout = RunLayout.of(spec.train.checkpoint_dir, run_id, spec.train.checkpoint_subdir)
        self.preempted: str | None = None
        self._done = threading.Event()

    def run(self) -> None:
        from tpu_ops.cloud.clients import Clients
        from tpu_ops.errors import TpuOpsError
        from tpu_ops.provision.providers import SliceState
        from tpu_ops.train.checkpoints import latest_complete_step

        gcs = Clients(self.settings).gcs()
        while not self._done.wait(0.2):
            try:
                if latest_complete_step(gcs, self.layout.steps_uri) is None:
                    continue
                found = self.provider.slices(list(self.spec.provision.slice.zones), self.run_id)
                # a multislice request on the TPU API is one record with a part per slice: lose its last slice
                for rec in [p for r in found for p in (r.parts[::-1] or (r,))]:
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


def _step(text: str) -> None:
    print(f"==> {text}", flush=True)


def _lineage(settings: Any, run_id: str) -> dict[str, Any]:
    """The run's lineage: what `tpu-ops audit lineage RUN_ID --json` prints."""
    from tpu_ops.cloud.clients import Clients
    from tpu_ops.export.release import load_lineage

    return load_lineage(run_id, Clients(settings))


def render_lineage(lineage: dict[str, Any]) -> str:
    """The lineage as text: what `tpu-ops audit lineage RUN_ID` prints."""
    from tpu_ops.audit.lineage import render

    return render(lineage)


def keep_files(settings: Any, spec: Any, run_id: str, lineage: dict[str, Any], where: Path) -> dict[str, str]:
    """What the dry run leaves to inspect once its clouds are gone: the run's audit trail as JSONL
    (every record and digest, as `tpu-ops audit dump` writes it), its goodput report and lineage."""
    from tpu_ops.audit.store import S3Store
    from tpu_ops.audit.trail import audit_clients
    from tpu_ops.cloud.clients import Clients
    from tpu_ops.layout import RunLayout
    from tpu_ops.uris import parse_s3

    where.mkdir(parents=True, exist_ok=True)
    clients = Clients(settings)
    s3, _ = audit_clients(clients)
    trail = where / "audit-trail.jsonl"
    with trail.open("w", encoding="utf-8") as fh:
        for _, body in S3Store(s3, parse_s3(settings.audit_uri), 1).read_all():
            fh.write(json.dumps(json.loads(body), sort_keys=True, separators=(",", ":"), ensure_ascii=False) + "\n")
    files = {"audit_trail": str(trail)}
    goodput = RunLayout.of(spec.train.checkpoint_dir, run_id, spec.train.checkpoint_subdir).goodput
    blob = clients.gcs().bucket(goodput.bucket).get_blob(goodput.prefix)
    if blob is not None:
        (where / "goodput.json").write_bytes(blob.download_as_bytes())
        files["goodput"] = str(where / "goodput.json")
    (where / "lineage.json").write_text(json.dumps(lineage, indent=2, default=str) + "\n")
    files["lineage"] = str(where / "lineage.json")
    return files


def inspect_commands(run_id: str, files: dict[str, str], state_dir: Path) -> list[str]:
    """The commands that read a finished dry run's files (no emulated cloud needed), runnable as printed
    in a shell where the venv is not activated: they name this environment's ``tpu-ops`` by its path."""
    from flows.commands._disk import tpu_ops_exe

    exe, q = tpu_ops_exe(), shlex.quote
    trail = q(files["audit_trail"])
    return [
        f"{exe} audit verify {trail} --no-signatures",
        f"{exe} audit lineage {q(run_id)} --trail {trail}",
        f"TPU_OPS_STATE_DIR={q(str(state_dir))} {exe} cost --run {q(run_id)}",
    ]


def _own_prefect_home(workdir: Path) -> contextlib.AbstractContextManager[Any]:
    """The temporary Prefect server's home under ``workdir``, not the user's ~/.prefect (shared with
    anything else on the machine); nothing when PREFECT_API_URL names a server to report to."""
    if os.environ.get("PREFECT_API_URL"):
        return contextlib.nullcontext()
    home = (workdir / "prefect-home").resolve()
    home.mkdir(parents=True, exist_ok=True)
    os.environ["PREFECT_HOME"] = str(home)  # the temporary server's process reads it from here
    from prefect.settings import PREFECT_HOME, temporary_settings

    return temporary_settings(updates={PREFECT_HOME: home})  # and this process, if Prefect is loaded


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
    from flows.budget import refusal

    over = refusal(spec.provision)  # like any run: refused before its first (emulated) cloud call
    if over:
        print(f"error: {over}", file=sys.stderr)
        return 1
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
    state_dir = args.workdir.resolve() / "state"
    _step("starting the local stack (moto, fake-gcs-server, fake Cloud TPU API, fake Compute Engine, host simulators)")
    with _own_prefect_home(args.workdir), LocalStack(workdir=args.workdir.resolve() / "workers", grace_s=2.0) as stack:
        # The flows read Settings from the environment, exactly as a deployment would.
        os.environ.update(stack.env())
        os.environ["TPU_OPS_STATE_DIR"] = str(state_dir)
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
        elastic = len(spec.provision.slice.shape_list) > 1  # examples/elastic.yaml: its own scenario
        from flows.commands._dryrun_elastic import ElasticScenario, shape_records, target_shape_env

        what = "the target shape stocked out, then back" if elastic else "one spot preemption"
        _step(f"running the retraining-pipeline flow as run {run_id} ({what} will be injected)")
        injector = (ElasticScenario if elastic else PreemptOnce)(stack, settings, spec, run_id)
        injector.start()
        try:
            result = retraining_pipeline(fixed)
            assert isinstance(result, dict)  # a spec already checked is never refused by the flow
            summary: dict[str, Any] = result
        finally:
            injector.stop()
        summary["injected_preemption"] = injector.preempted
        from flows.commands._baseline import compare_with_uninterrupted
        from tpu_ops.cloud.clients import Clients

        _step("checking the final parameters against the same trainer run uninterrupted")
        summary["final_params"] = compare_with_uninterrupted(
            os.environ,
            Clients(settings).gcs(),
            spec.train,
            summary.get("checkpoints", ""),
            summary.get("manifest"),
            (summary.get("training") or {}).get("final_step"),
            target_shape_env(spec),  # elastic shapes: the uninterrupted run is the target shape's
        )
        if isinstance(injector, ElasticScenario):
            summary["elastic"] = {"injected": injector.events, "ledger": shape_records(run_id)}
        # what the emulated clouds still hold (the flow checked its own teardown; this checks the hosts too)
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
        lineage = _lineage(settings, run_id)
        summary["lineage"] = render_lineage(lineage)
        summary["backend"] = backend.value
        summary["files"] = keep_files(settings, spec, run_id, lineage, args.workdir / "runs" / run_id)
    from flows.commands._disk import disk_bytes, remove_workers

    if not args.keep:  # the stack (and every worker process) is gone: nothing reads them any more
        remove_workers(args.workdir / "workers")
    summary["disk"] = {"path": str(args.workdir), "bytes": disk_bytes(args.workdir), "workers_kept": args.keep}
    summary["seconds"] = round(time.monotonic() - started, 1)
    commands = inspect_commands(run_id, summary["files"], args.workdir / "state")
    if args.json:
        print(json.dumps(summary, indent=2, default=str), file=out)
    else:
        from flows.report import glance_rows, glance_text

        _step("done")
        print(glance_text(glance_rows(summary)), file=out)
        print(f"took {summary['seconds']} s\n\n{summary['lineage']}", file=out)
    print(f"\nThe run's files are in {args.workdir / 'runs' / run_id}; the emulated clouds are gone, these read them:")
    for line in commands:
        print(f"  {line}")
    return 0 if leftover == 0 else 1
