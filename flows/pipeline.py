"""The retraining pipeline as one Prefect flow: mirror → train (supervisor) → tear down → export → seal.

The run (:class:`tpu_ops.run.Run`: its id, layout, clients with the blocks' credentials, ledger and
audit chain) is built once here and passed to every step. The training step is the supervisor
(``flows.train.supervise_task``): it provisions through the capacity ladder, runs the job on every
worker (each worker first verifies the pinned snapshot, then resumes from the newest complete
checkpoint), recovers from preemptions, and tears down. Then the export (when the run left a
complete checkpoint) and a signed digest sealing the run's audit chain.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

from prefect import State, flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.states import Failed

from flows import report
from flows.budget import refusal
from flows.export import export_and_seal
from flows.failures import missing_buckets_named
from flows.mirror import mirror_dataset
from flows.provision import HOOKS, _quota, _tag_current_run, teardown_task
from flows.settings import open_run
from flows.train import supervise_task
from tpu_ops.errors import SpecError
from tpu_ops.provision.ledger import ATTEMPT, Ledger
from tpu_ops.provision.prices import load as load_prices
from tpu_ops.provision.records import Attempt
from tpu_ops.run import Run
from tpu_ops.runs import collect_reports
from tpu_ops.specs import PipelineSpec, TrainJobSpec, parse_spec


def new_run_id(name: str, now: datetime | None = None) -> str:
    """``<name>-<yymmdd>-<hhmmss>``, within the 40 characters a run id may have."""
    stamp = (now or datetime.now(UTC)).strftime("%y%m%d-%H%M%S")
    return f"{name[:26].rstrip('-')}-{stamp}"


PIPELINE_LIMIT_PREFIX = "tpu-ops-pipeline-"
SECOND_RUN_WAIT_S = 30.0


@contextmanager
def one_run_at_a_time(pipeline: str, wait_s: float = SECOND_RUN_WAIT_S) -> Iterator[None]:
    """Hold pipeline ``pipeline``'s one slot (a Prefect global concurrency limit of 1, created on
    first use) for the whole run. A second run of the same pipeline waits ``wait_s`` seconds, then
    fails saying why: two runs would mirror into one snapshot and train twice."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
    from prefect.concurrency.sync import concurrency
    from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound

    from tpu_ops.errors import ConfigError

    name = PIPELINE_LIMIT_PREFIX + pipeline
    with get_client(sync_client=True) as client:
        try:  # looked up first: a blind create of an existing limit logs a server-side traceback
            client.read_global_concurrency_limit_by_name(name)
        except ObjectNotFound:
            with contextlib.suppress(ObjectAlreadyExists):  # another run created it meanwhile
                client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=name, limit=1))
    held = False
    try:
        with concurrency(name, occupy=1, timeout_seconds=wait_s, strict=True):
            held = True
            yield
    except TimeoutError:
        if held:
            raise  # the run's own timeout, not the slot's
        raise ConfigError(
            f"pipeline {pipeline!r} already has a run in progress (Prefect concurrency limit {name!r}); "
            "at most one run per pipeline name: wait for it, or cancel it in the UI"
        ) from None


@task(name="workers-verified", cache_policy=NO_CACHE)
def workers_verified(run: Run, hosts: int) -> list[dict[str, Any]]:
    """Every worker's pre-flight report of the snapshot (written before its first training step)."""
    return collect_reports(run.clients.gcs(), str(run.layout.preflight), hosts, 30.0)


def _attempts(ledger: Ledger) -> list[str]:
    fields = Attempt.__dataclass_fields__
    return [Attempt(**{k: e[k] for k in fields if k in e}).describe() for e in ledger.events() if e["kind"] == ATTEMPT]


def _ladder(ledger: Ledger) -> list[dict[str, Any]]:
    """The run's queued-resource attempts, in order, as records (the ladder table's rows)."""
    fields = Attempt.__dataclass_fields__
    return [{k: e[k] for k in fields if k in e} for e in ledger.events() if e["kind"] == ATTEMPT]


def _training_poll(run: Run, steps: int) -> Any:
    """What the run-level progress shows while the supervisor works: attempts, then committed steps."""
    from tpu_ops.train.checkpoints import latest_complete_step

    gcs, steps_uri = run.clients.gcs(), run.layout.steps_uri

    def poll() -> tuple[float, str]:
        step = latest_complete_step(gcs, steps_uri)
        if step is None:
            return 0.0, f"waiting for a slice and a first checkpoint ({len(_ladder(run.ledger))} attempt(s) so far)"
        return step / steps, f"step {step}/{steps} committed"

    return poll


# validate_parameters=False: the spec is checked below instead, so a cross-field rule the form's JSON
# schema cannot express (checkpoint_every > steps) fails the run with one line, not a traceback.
@flow(name="retraining-pipeline", log_prints=True, validate_parameters=False, **HOOKS)
def retraining_pipeline(
    spec: PipelineSpec,
    aws_credentials_block: str | None = None,
    gcp_credentials_block: str | None = None,
    inject_preemption: bool = False,
) -> dict[str, Any] | State:
    """Mirror the dataset, train on a slice through preemptions from the pinned snapshot, tear down.

    Args:
        spec: The whole pipeline: mirror, provision (slice and capacity ladder), train, export. Its
            run_id (the only one: there is no second, top-level one) fixes the run to resume;
            empty: a new run id from the pipeline name and the time.
        aws_credentials_block: Name of a Prefect AwsCredentials block; empty: the environment's credentials.
        gcp_credentials_block: Name of a Prefect GcpCredentials block; empty: the environment's credentials.
        inject_preemption: Local stack only: preempt the slice once after the first checkpoint, to watch the recovery.
    """
    try:
        spec = spec if isinstance(spec, PipelineSpec) else parse_spec(PipelineSpec, spec, what="spec")
    except SpecError as exc:
        get_run_logger().error("%s", exc)
        problems = "; ".join(f"spec.{e['field']}: {e['message']}" for e in exc.errors) or str(exc)
        return Failed(message=f"invalid spec: {problems}")
    over = refusal(spec.provision)  # before the mirror step: copying the dataset already pays S3 egress
    if over:
        get_run_logger().error("%s", over)
        return Failed(message=over)
    from flows.chaos import injected_preemption
    from flows.settings import resolve_settings
    from tpu_ops.layout import RunLayout

    run_id = spec.run_id or new_run_id(spec.name)
    layout = RunLayout.of(spec.train.checkpoint_dir, run_id, spec.train.checkpoint_subdir)
    with one_run_at_a_time(spec.name), missing_buckets_named(), injected_preemption(
        inject_preemption, resolve_settings(), spec.provision, layout, run_id, get_run_logger().info
    ):
        return _run(spec, run_id, aws_credentials_block, gcp_credentials_block)


def _run(
    spec: PipelineSpec, run_id: str, aws_credentials_block: str | None, gcp_credentials_block: str | None
) -> dict[str, Any]:
    """The pipeline's steps, inside its one-run-at-a-time slot."""
    logger = get_run_logger()
    run = open_run(run_id, aws_credentials_block, gcp_credentials_block, checkpoint_dir=spec.train.checkpoint_dir,
                   checkpoint_subdir=spec.train.checkpoint_subdir)  # fmt: skip
    _tag_current_run(run.id)
    progress = report.RunProgress(run_id)
    progress.stage("mirror", 0, 15)
    snapshot = mirror_dataset(spec.mirror, aws_credentials_block, gcp_credentials_block, run_id=run_id)
    job = TrainJobSpec(provision=spec.provision, train=spec.train.model_copy(
        update={"dataset_manifest": snapshot.manifest_uri}))  # fmt: skip
    hosts = spec.provision.slice.accelerator.hosts * spec.provision.slice.slices  # every host of every slice
    progress.stage("provisioning and training", 15, 90)
    progress.watch(_training_poll(run, spec.train.steps))
    try:
        with _quota(spec.provision):
            training = supervise_task(job, run)
        reports = workers_verified(run, hosts)
    finally:
        progress.unwatch()
        gone = teardown_task(run, list(spec.provision.slice.zones))
        logger.info("teardown: %s", gone.describe())
    last = training["incarnations"][-1] if training["incarnations"] else {}
    summary: dict[str, Any] = {
        "run_id": run_id,
        "snapshot_id": snapshot.snapshot_id,
        "manifest": snapshot.manifest_uri,
        "objects_copied": snapshot.objects_copied,
        "objects_skipped": snapshot.objects_skipped,
        "slice": {
            "queued_resource": last.get("queued_resource"),
            "zone": last.get("zone"),
            "tier": last.get("tier"),
            "hosts": hosts,
            "slices": spec.provision.slice.slices,
        },
        "attempts": _attempts(run.ledger),
        "ladder": _ladder(run.ledger),
        "workers_verified": len({(r["node_id"], r["worker_number"]) for r in reports}),
        "training": {
            k: training[k]
            for k in ("outcome", "final_step", "steps", "wall_s", "productive_s", "goodput", "badput_s", "recoveries")
            if k in training
        }
        | {"efficiency": training.get("efficiency") or {}},  # $/M tokens and MFU, when the trainer reports them
        "preemptions": training["preemptions"],
        **({"shapes": training["shapes"]} if training.get("shapes") else {}),  # elastic: each shape's steps
        "checkpoints": run.run_uri,
        "cost": run.ledger.summary(load_prices(run.settings)).to_json(),
    }
    # Export (when the run left a complete checkpoint), then the digest sealing the run's audit chain.
    progress.stage("export and audit digest", 90, 99)
    summary["export"] = export_and_seal(spec.export, run, snapshot.manifest_uri)
    # the same rows as the dry run's table: the trail verified, and what teardown left (it confirms)
    summary["audit"] = report.verify_trail(run.clients, run_id)
    summary["left_behind"] = {"tpu_resources": 0} if gone.confirmed_gone else {"unconfirmed": True}
    report.publish(summary)  # the run page: summary, cost, ladder, goodput, lineage
    progress.done()
    return summary
