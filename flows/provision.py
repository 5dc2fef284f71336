"""Prefect flows around the capacity ladder: ``provision_slice`` and ``run_on_slice``.

Tasks are thin (one library call each) and have no Prefect retries: the library retries transient
errors itself, and a retrying task inside a transaction would roll back (and delete the slice) on
its first failed attempt. Teardown is guaranteed three ways: ``run_on_slice`` tears down in a
``finally``; both flows carry ``on_failure`` / ``on_cancellation`` / ``on_crashed`` hooks that tear
down; and the reaper deployment catches what a ``kill -9`` leaves behind.
"""

import contextlib
import os
import subprocess
import time
from collections.abc import Iterator
from typing import Any
from uuid import UUID

from prefect import State, flow, get_run_logger, task
from prefect.artifacts import create_table_artifact
from prefect.cache_policies import NO_CACHE
from prefect.runtime import flow_run as current_run

from flows.audit import current_actor, emit
from flows.settings import open_run, resolve_settings
from tpu_ops.audit.events import AuditEvent
from tpu_ops.cloud.clients import Clients
from tpu_ops.provision import Slice, provision, teardown
from tpu_ops.provision.providers import available
from tpu_ops.provision.records import TeardownReport
from tpu_ops.run import Run
from tpu_ops.specs.common import RunId
from tpu_ops.specs.slice import ProvisionSpec

RUN_TAG_PREFIX = "tpu-ops-run:"


def run_tag(run_id: str) -> str:
    """The Prefect tag that ties flow runs to a tpu-ops run id (the reaper looks runs up by it)."""
    return RUN_TAG_PREFIX + run_id


def _tag_current_run(run_id: str) -> None:
    """Add the run tag to this flow run (deployment runs are created before the run id is known)."""
    from prefect.client.orchestration import get_client

    fr_id = current_run.get_id()
    if not fr_id:
        return
    tags = sorted({*(current_run.tags or []), run_tag(run_id)})
    with get_client(sync_client=True) as client:
        client.update_flow_run(UUID(str(fr_id)), tags=tags)


def teardown_hook(flow: Any, flow_run: Any, state: Any) -> None:
    """Flow hook (called by keyword): tear down every run this flow run is tagged with.

    The one teardown hook of every flow that provisions. It finds the run by its tag (read back
    from the API: the tag is added after the run started), so a flow whose run id is derived at
    run time is covered too. Zones come from the spec parameter when it names them; otherwise
    ``teardown`` looks where the run's ledger says it has been.
    """
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        tags = client.read_flow_run(UUID(str(flow_run.id))).tags
    run_ids = [t.removeprefix(RUN_TAG_PREFIX) for t in tags if t.startswith(RUN_TAG_PREFIX)]
    if not run_ids:  # e.g. its parameters were refused: nothing ran, no cloud call is due
        return
    params = dict(getattr(flow_run, "parameters", None) or {})
    # the flow's own blocks, both: the run's last records carry the same credentials as the others
    settings = resolve_settings(params.get("aws_credentials_block"), params.get("gcp_credentials_block"))
    clients = Clients(settings)
    providers = available(settings, clients)
    for run_id in run_ids:
        run = Run(run_id, settings, clients=clients, actor=current_actor)
        holder = _held_elsewhere(params.get("spec"), run_id, clients)
        if holder is not None:  # e.g. this flow was a second supervisor, refused: the slice is not its to delete
            print(f"teardown of run {run_id} skipped: supervisor pid {holder.get('pid')} on {holder.get('host')} "
                  f"holds the run")  # fmt: skip
            continue
        report = teardown(run_id, settings, zones=_spec_zones(params.get("spec")), providers=providers)
        names = ", ".join(r.resource_id for r in report.deleted) or "nothing left"
        ended = str(getattr(state, "name", state))
        print(f"teardown of run {run_id} after {ended}: deleted {names}")
        layout = _layout_of(params.get("spec"), run_id)
        if report.deleted and layout is not None:  # after its supervisor's last copy: readers elsewhere see it end
            from tpu_ops.errors import TpuOpsError
            from tpu_ops.train.costs import publish_merged

            with contextlib.suppress(TpuOpsError):  # a copy for readers elsewhere: never fails the hook
                publish_merged(clients.gcs(), layout, run.ledger)
        # The run's chain records how it ended and is sealed, whichever flow it was.
        run.audit.record(AuditEvent.RUN_ENDED, params={"state": ended, "flow": getattr(flow, "name", "")},
                         outcome="failure", subjects=_deleted(settings.gcp_project, report))  # fmt: skip
        run.audit.digest()


def _deleted(project: str | None, report: TeardownReport) -> list[dict[str, Any]]:
    """The audit subjects of what a teardown deleted."""
    return [{"uri": f"tpu://{project}/{r.zone}/{r.resource_id}", "kind": r.kind} for r in report.deleted]


def _layout_of(spec: Any, run_id: str) -> Any:
    """A training run's layout (``RUN/_tpu_ops/...``) from its spec parameter; None for a slice or a bad spec."""
    train = spec.get("train") if isinstance(spec, dict) else None
    if not isinstance(train, dict) or not train.get("checkpoint_dir"):
        return None
    from tpu_ops.errors import TpuOpsError
    from tpu_ops.layout import RunLayout

    try:
        return RunLayout.of(str(train["checkpoint_dir"]), run_id, str(train.get("checkpoint_subdir") or ""))
    except (TpuOpsError, ValueError):
        return None


def _held_elsewhere(spec: Any, run_id: str, clients: Clients) -> dict[str, Any] | None:
    """The live supervisor holding a training run's lease (``RUN/_tpu_ops/lease.json``), if any."""
    from tpu_ops.errors import TpuOpsError
    from tpu_ops.train.runstate import live_holder

    layout = _layout_of(spec, run_id)
    try:
        return None if layout is None else live_holder(clients.gcs(), layout.lease)
    except (TpuOpsError, ValueError):
        return None  # unknown: tear down as before


def _spec_zones(spec: Any) -> list[str] | None:
    """The slice's zones in a provision spec or a pipeline spec (parameters arrive as dicts)."""
    if not isinstance(spec, dict):
        return None
    slice_ = spec.get("slice") or (spec.get("provision") or {}).get("slice") or {}
    return list(slice_.get("zones") or []) or None


HOOKS: dict[str, Any] = {
    "on_failure": [teardown_hook],
    "on_cancellation": [teardown_hook],
    "on_crashed": [teardown_hook],
}


@task(name="provision-slice", cache_policy=NO_CACHE)
def provision_task(spec: ProvisionSpec, run: Run, metadata: dict[str, str] | None = None) -> Slice:
    """The capacity ladder (retries inside the library, none here); ``metadata`` goes on the node."""
    logger = get_run_logger()

    def on_attempt(a: Any) -> None:
        logger.info("attempt %s", a.describe())

    params = {"accelerator_type": spec.slice.accelerator_type, "zones": list(spec.slice.zones),
              "ladder": [r.model_dump() for r in spec.ladder], "budget_usd": spec.budget_usd,
              "backend": spec.slice.resolved_backend.value}  # fmt: skip
    logger.info("backend %s: %s", spec.slice.resolved_backend, spec.slice.backend_reason)
    with run.audit.audited(AuditEvent.SLICE_PROVISIONED, params=params) as rec:
        s = provision(spec, run.id, run.settings, clients=run.clients, on_attempt=on_attempt, metadata=metadata)
        rec["params"].update(tier=s.tier, zone=s.zone, queued_resource=s.queued_resource, node=s.node,
                             hosts=s.hosts, attempts=[a.describe() for a in s.attempts])  # fmt: skip
        rec["subjects"].append({"uri": f"tpu://{run.settings.gcp_project}/{s.zone}/{s.node}", "kind": "slice"})
    emit(AuditEvent.SLICE_PROVISIONED, run.id, slice_event(s))
    return s


def slice_event(s: Slice) -> dict[str, Any]:
    """The payload of ``tpu-ops.slice.provisioned``: which slice, where, on which tier."""
    keys = ("queued_resource", "node", "zone", "tier", "accelerator_type", "chips", "hosts", "backend")
    return {k: getattr(s, k) for k in keys}


@task(name="teardown-slice", cache_policy=NO_CACHE)
def teardown_task(run: Run, zones: list[str] | None = None) -> TeardownReport:
    """Delete the run's slices on every control plane; ``tpu-ops.slice.deleted`` once they are confirmed gone."""
    with run.audit.audited(AuditEvent.SLICE_DELETED, params={"zones": zones or []}) as rec:
        report = teardown(run.id, run.settings, zones=zones, providers=available(run.settings, run.clients))
        rec["params"].update(confirmed_gone=report.confirmed_gone, seconds=round(report.seconds, 3))
        rec["subjects"] += _deleted(run.settings.gcp_project, report)
    if report.confirmed_gone:
        deleted = {"deleted": report.to_json()["deleted"], "seconds": round(report.seconds, 2)}
        emit(AuditEvent.SLICE_DELETED, run.id, deleted)
    return report


def _attempts_artifact(run: Run, s: Slice) -> None:
    rows = [
        {
            "#": a.number,
            "tier": a.tier,
            "zone": a.zone,
            "id": a.resource_id,
            "outcome": a.outcome,
            "waited (s)": f"{a.seconds_waited:.1f}",
            "detail": a.detail,
        }
        for a in s.attempts
    ]
    create_table_artifact(rows, description=f"capacity ladder for run {s.run_id}: {s.tier} in {s.zone}")
    _choice_artifact(run)


def _choice_artifact(run: Run) -> None:
    """A cost-ranked ladder's last plan (``ladder: auto``): each rung's $ per kept step, completion, why."""
    from tpu_ops.provision.ranking import CHOICE_EVENT, plan_rows

    plans = [e["plan"] for e in run.ledger.events() if e.get("kind") == CHOICE_EVENT]
    if plans:
        create_table_artifact(plan_rows(plans[-1]), description=f"ladder ranking for run {run.id}: {plans[-1]['note']}")


@contextlib.contextmanager
def _quota(spec: ProvisionSpec) -> Iterator[None]:
    """Hold ``spec.quota_limit`` (a Prefect global concurrency limit, in chips) while a slice exists.

    The limit must exist (a typo must not silently disable the quota). The lease is renewed in the
    background for as long as the slice lives, so multi-day runs are fine; a failed renewal only
    warns (``strict=False``) rather than killing a training run over a Prefect API blip. Waiting
    for free chips counts against the spec's overall timeout.
    """
    if not spec.quota_limit:
        yield
        return
    from prefect.client.orchestration import get_client
    from prefect.concurrency.sync import concurrency
    from prefect.exceptions import ObjectNotFound

    from tpu_ops.errors import SpecError

    with get_client(sync_client=True) as client:
        try:
            client.read_global_concurrency_limit_by_name(spec.quota_limit)
        except ObjectNotFound:
            raise SpecError(
                f"quota_limit {spec.quota_limit!r} is not a Prefect global concurrency limit; create it with "
                f"`prefect gcl create {spec.quota_limit} --limit <chips>`",
                [{"field": "quota_limit", "value": spec.quota_limit}],
            ) from None
    chips = spec.slice.accelerator.chips
    with concurrency(spec.quota_limit, occupy=chips, timeout_seconds=spec.overall_timeout.total_seconds()):
        yield


def _over_budget(spec: ProvisionSpec) -> State | None:
    """The failed state of a flow whose spec is over budget (logged on one line), before any cloud call."""
    from prefect.states import Failed

    from flows.budget import refusal

    over = refusal(spec, "budget_usd")
    if not over:
        return None
    get_run_logger().error("%s", over)
    return Failed(message=over)


@flow(name="provision-slice", log_prints=True, **HOOKS)
def provision_slice(
    spec: ProvisionSpec, run_id: RunId, gcp_credentials_block: str | None = None,
    aws_credentials_block: str | None = None,
) -> dict[str, Any] | State:  # fmt: skip
    """Provision a slice for ``run_id`` through the capacity ladder; tear it down if the flow fails.

    Args:
        spec: The slice (accelerator, region, zones), the capacity ladder, budget and timeouts.
        run_id: The run's id (lowercase letters, digits, '-', ≤ 40); the same id adopts or resumes that run.
        gcp_credentials_block: Name of a Prefect GcpCredentials block; empty: the environment's credentials.
        aws_credentials_block: Name of a Prefect AwsCredentials block (the audit trail's); empty: the environment's.
    """
    if over := _over_budget(spec):
        return over
    run = open_run(run_id, aws_credentials_block, gcp_credentials_block)
    _tag_current_run(run.id)
    s = provision_task(spec, run)
    _attempts_artifact(run, s)
    # The slice outlives this flow run on purpose: tell the reaper it is the user's until teardown.
    run.ledger.hand_off(s.queued_resource)
    run.audit.digest()
    return s.to_json()


@flow(name="run-on-slice", log_prints=True, **HOOKS)
def run_on_slice(
    spec: ProvisionSpec,
    run_id: RunId,
    command: list[str] | None = None,
    hold_seconds: float = 0.0,
    gcp_credentials_block: str | None = None,
    aws_credentials_block: str | None = None,
) -> dict[str, Any] | State:
    """Provision, run ``command`` (or hold the slice ``hold_seconds``), then always tear down.

    The slice's zone, node and endpoints are passed to the command as ``TPU_OPS_SLICE_*`` variables.

    Args:
        spec: The slice (accelerator, region, zones), the capacity ladder, budget and timeouts.
        run_id: The run's id (lowercase letters, digits, '-', ≤ 40); the same id adopts or resumes that run.
        command: argv run on this machine once the slice is up (it gets TPU_OPS_SLICE_* variables).
        hold_seconds: Keep the slice this many seconds before tearing it down (0: not at all).
        gcp_credentials_block: Name of a Prefect GcpCredentials block; empty: the environment's credentials.
        aws_credentials_block: Name of a Prefect AwsCredentials block (the audit trail's); empty: the environment's.
    """
    if over := _over_budget(spec):
        return over
    run = open_run(run_id, aws_credentials_block, gcp_credentials_block)
    _tag_current_run(run.id)
    zones = list(spec.slice.zones)
    try:
        with _quota(spec):
            s = provision_task(spec, run)
            _attempts_artifact(run, s)
            if command:
                env_vars = {
                    "TPU_OPS_SLICE_ZONE": s.zone,
                    "TPU_OPS_SLICE_NODE": s.node,
                    "TPU_OPS_SLICE_ENDPOINTS": ",".join(s.endpoints),
                }
                subprocess.run(command, check=True, env={**os.environ, **env_vars})
            if hold_seconds > 0:
                time.sleep(hold_seconds)
            result = s.to_json()
    finally:
        report = teardown_task(run, zones)
        print(f"teardown of run {run.id}: {report.describe()}")
        run.audit.digest()
    return result


if __name__ == "__main__":  # pragma: no cover - `python -m flows.provision serve` for local use
    run_on_slice.serve(name="local")
