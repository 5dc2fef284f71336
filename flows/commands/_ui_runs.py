"""Runs started from the Prefect UI or on a schedule: the flow runs of the tpu-ops deployments, read from
the configured Prefect API as the launch records ``launch`` would have written for them.

A run's id comes from the flow run's parameters (``run_id``, or the pipeline's ``spec.run_id``), else
from its ``tpu-ops-run:<id>`` tag: a pipeline that generates its id (``spec.run_id`` empty, e.g. on a
schedule) tags its flow run with it as soon as it has one (``flows.provision._tag_current_run``).
Only a configured API is asked (never a temporary server), with a short timeout and no retries: an
outage is one line, never a hang.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

from tpu_ops.train.launches import LAUNCH, LAUNCH_TAG, PIPELINE, PROVISION, SCHEDULE, TRAIN_JOB, UI, LaunchRecord

FLOWS = {"train": TRAIN_JOB, "retraining-pipeline": PIPELINE, "provision-slice": PROVISION, "run-on-slice": PROVISION}
"""The flows whose deployment runs are tpu-ops runs, and the spec kind each runs."""
WINDOW = timedelta(days=7)
LIMIT = 50  # status lists at most this many flow runs of the last WINDOW, newest first
TIMEOUT_S = 5.0
RUN_TAG_PREFIX = "tpu-ops-run:"  # flows.provision.RUN_TAG_PREFIX (not imported: that module imports the flows)
FINAL = {"COMPLETED": "done", "FAILED": "failed", "CRASHED": "failed", "CANCELLED": "cancelled"}
"""A final flow run state's type → how the run ended."""


class Unreachable(Exception):
    """The configured Prefect API did not answer (or refused this client)."""


def api_url() -> str | None:
    """``PREFECT_API_URL``, or None when none is configured."""
    from prefect.settings import PREFECT_API_URL

    url = PREFECT_API_URL.value()
    return str(url) if url else None


def run_id_of(kind: str, params: dict[str, Any], tags: list[str]) -> str | None:
    """The tpu-ops run id a flow run works on: its parameters', else its run tag's, else None (not known yet)."""
    spec = params.get("spec")
    given = params.get("run_id") if kind != PIPELINE else (spec.get("run_id") if isinstance(spec, dict) else None)
    if isinstance(given, str) and given:
        return given
    tagged = sorted(t.removeprefix(RUN_TAG_PREFIX) for t in tags if t.startswith(RUN_TAG_PREFIX))
    return tagged[0] if tagged else None


def end_of(state: Any) -> tuple[str, str] | None:
    """How a flow run ended (``done`` | ``failed`` | ``cancelled``, its message); None while it goes on."""
    if state is None or not state.is_final():
        return None
    return FINAL.get(state.type.value, "failed"), str(state.message or "")


def record_of(flow_name: str, flow_run: Any, ui: str | None = None) -> LaunchRecord | None:
    """The launch record of one flow run of ``flow_name``, as ``launch`` fills it from the spec; None if
    it is not a tpu-ops run or has no run id yet. A spec that does not validate (the flow refused it)
    gives a record without checkpoint location: ``status`` shows the flow run's state and message."""
    from flows.commands.validate import spec_class
    from tpu_ops.errors import SpecError
    from tpu_ops.layout import run_id_problem
    from tpu_ops.specs import parse_spec
    from tpu_ops.train.launches import PREFECT, from_spec

    kind = FLOWS.get(flow_name)
    params = dict(flow_run.parameters or {})
    run_id = run_id_of(kind, params, list(flow_run.tags or [])) if kind else None
    if kind is None or run_id is None or run_id_problem(run_id):
        return None
    end = end_of(flow_run.state)
    try:
        spec: Any = parse_spec(spec_class(kind), params.get("spec"), what="spec")
    except SpecError:
        record = LaunchRecord(run_id, kind, PREFECT)
        record.outcome, record.error = end or ("", "")
    else:
        record = from_spec(kind, spec, run_id)
        if kind == PROVISION and end is not None:
            record.outcome, record.error = end  # a provision run's status has no run state saying it ended
    record.mode, record.flow_run_id = PREFECT, str(flow_run.id)
    record.origin = SCHEDULE if flow_run.auto_scheduled else LAUNCH if LAUNCH_TAG in (flow_run.tags or []) else UI
    when = flow_run.start_time or flow_run.expected_start_time or flow_run.created
    record.launched_at = when.timestamp() if when else record.launched_at
    record.ui_url = f"{ui.rstrip('/')}/runs/flow-run/{flow_run.id}" if ui else ""
    return record


@contextlib.contextmanager
def _client() -> Iterator[Any]:
    """A sync client on the configured API: a short timeout, no retries; ``Unreachable`` on any failure."""
    import httpx
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_CLIENT_MAX_RETRIES, temporary_settings

    if not api_url():  # get_client would start a temporary server: never, just to ask
        raise Unreachable("no Prefect API configured (PREFECT_API_URL)")
    short, once = {"timeout": httpx.Timeout(TIMEOUT_S)}, {PREFECT_CLIENT_MAX_RETRIES: 0}
    try:
        with temporary_settings(once), get_client(sync_client=True, httpx_settings=short) as client:
            yield client
    except (httpx.HTTPError, OSError) as exc:
        raise Unreachable(f"{type(exc).__name__}: {exc}".rstrip(": ")) from None


Found = tuple[LaunchRecord, tuple[str, str] | None]
"""A flow run's record and how it ended (None while it goes on)."""


def _read(client: Any, tags: list[str] | None, limit: int) -> list[Found]:
    """The records (and ends) of the newest flow runs of the tpu-ops flows: with ``tags``, of any age; else of
    the last ``WINDOW``."""
    from prefect.client.schemas.filters import (
        FlowFilter,
        FlowFilterName,
        FlowRunFilter,
        FlowRunFilterDeploymentId,
        FlowRunFilterExpectedStartTime,
        FlowRunFilterTags,
    )
    from prefect.client.schemas.sorting import FlowRunSort
    from prefect.settings import PREFECT_UI_URL

    flows = FlowFilter(name=FlowFilterName(any_=list(FLOWS)))
    now = datetime.now(UTC)
    runs = FlowRunFilter(deployment_id=FlowRunFilterDeploymentId(is_null_=False))
    if tags:
        runs.tags = FlowRunFilterTags(all_=tags)
    else:  # a schedule's runs to come are not runs yet
        runs.expected_start_time = FlowRunFilterExpectedStartTime(after_=now - WINDOW, before_=now)
    newest = FlowRunSort.EXPECTED_START_TIME_DESC
    found = client.read_flow_runs(flow_filter=flows, flow_run_filter=runs, sort=newest, limit=limit)
    if not found:
        return []
    names = {f.id: f.name for f in client.read_flows(flow_filter=flows, limit=len(FLOWS))}
    ui = PREFECT_UI_URL.value()
    out = [(record_of(names.get(fr.flow_id, ""), fr, str(ui) if ui else None), end_of(fr.state)) for fr in found]
    return [(r, end) for r, end in out if r is not None]


def recent() -> list[Found]:
    """Every tpu-ops run among the last ``LIMIT`` deployment flow runs of the last ``WINDOW``, newest first,
    one per run id (its newest flow run). ``Unreachable`` if the API does not answer."""
    with _client() as client:
        records = _read(client, None, LIMIT)
    newest: dict[str, Found] = {}
    for r, end in records:
        newest.setdefault(r.run_id, (r, end))
    return list(newest.values())


def lookup(run_id: str) -> LaunchRecord | None:
    """The newest flow run working on ``run_id`` (tagged with it, or named in its parameters), as a record."""
    with _client() as client:
        for record, _ in _read(client, [RUN_TAG_PREFIX + run_id], 5):
            if record.run_id == run_id:
                return record
        # a run started in the UI is tagged only once it runs: one still scheduled or pending is found here
        return next((r for r, _ in _read(client, None, LIMIT) if r.run_id == run_id), None)


def spec_of(flow_run_id: str) -> dict[str, Any] | None:
    """The ``spec`` parameter of a flow run (what ``launch`` keeps as ``spec.json``)."""
    from uuid import UUID

    with _client() as client:
        spec = client.read_flow_run(UUID(flow_run_id)).parameters.get("spec")
    return spec if isinstance(spec, dict) else None
