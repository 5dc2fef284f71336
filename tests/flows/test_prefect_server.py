"""Prefect's own server, scheduler and CLI against the pinned dependency set, for real.

An upgrade that breaks one of them fails here: SQLAlchemy 2.1 stopped the scheduler from creating
runs; fastapi 0.154 made `prefect deployment ls` / `flow-run ls` / `work-pool ls` answer 422.
One `prefect server start` (the session's ``prefect_server``) and one `tpu-ops serve` against the
local stack serve both tests; the CLI test runs while the pipeline's cron minute comes round.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.local._proc import http_call, kill_group, wait_until

ROOT = Path(__file__).resolve().parents[2]
PREFECT = str(Path(sys.executable).with_name("prefect"))
# Each `prefect` command imports Prefect afresh (2-4 s idle; 10-40 s on a machine loaded 10x).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def api(env: dict[str, str], path: str, body: dict[str, Any] | None = None) -> Any:
    """A call to the Prefect REST API the environment points at (POST when there is a body)."""
    data = json.dumps(body).encode() if body is not None else None
    return json.loads(http_call(env["PREFECT_API_URL"] + path, "POST" if data else "GET", data))


def runs_of(env: dict[str, str], deployment: str) -> list[dict[str, Any]]:
    """Flow runs of ``flow/deployment``, newest first."""
    dep_id = api(env, f"/deployments/name/{deployment}")["id"]
    query = {"flow_runs": {"deployment_id": {"any_": [dep_id]}}, "sort": "START_TIME_DESC"}
    return list(api(env, "/flow_runs/filter", query))


def prefect(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``prefect ARGS`` from the repository root; fails the test, showing the output, on a non-zero exit."""
    t0 = time.monotonic()
    proc = subprocess.run([PREFECT, "--no-prompt", *args], cwd=ROOT, env={**env, "COLUMNS": "250"},
                          capture_output=True, text=True, timeout=timeout)  # fmt: skip
    print(f"prefect {' '.join(args[:2])}: {time.monotonic() - t0:.1f}s")
    assert proc.returncode == 0, f"prefect {' '.join(args)}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def one_shot_cron(lead: timedelta) -> tuple[str, datetime]:
    """A 5-field cron (UTC) that fires once today, at the first whole minute at least ``lead`` away."""
    at = (datetime.now(UTC) + lead + timedelta(seconds=59)).replace(second=0, microsecond=0)
    return f"{at.minute} {at.hour} {at.day} {at.month} *", at


@pytest.fixture(scope="module")
def served(
    prefect_server: dict[str, str], local_stack: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    """`tpu-ops serve` of the dry-run pipeline (seeded, on a one-shot cron) and a reaper every 60 s."""
    from infra.local.seed import DRY_RUN_CAPACITY, seed_pipeline
    from tpu_ops.specs import PipelineSpec, parse_spec

    local_stack.reset()
    local_stack.set_capacity(DRY_RUN_CAPACITY)
    tmp = tmp_path_factory.mktemp("served")
    cron, fires_at = one_shot_cron(timedelta(seconds=30))  # serve registers well before that minute
    doc = yaml.safe_load((ROOT / "flows" / "dryrun.yaml").read_text())
    doc.update(name="scheduled-dry-run", schedule=cron)
    spec = parse_spec(PipelineSpec, doc)
    seed_pipeline(local_stack.settings(), spec)
    (tmp / "spec.yaml").write_text(yaml.safe_dump(doc))
    env = {
        **prefect_server,
        **local_stack.env(),
        "TPU_OPS_STATE_DIR": str(tmp / "state"),
        "TPU_OPS_POLL_INTERVAL_S": "0.2",
        "PREFECT_RUNNER_POLL_FREQUENCY": "2",
        "PYTHONPATH": str(ROOT),
    }
    serve = subprocess.Popen(
        [sys.executable, "-m", "flows.cli", "serve", "--spec", str(tmp / "spec.yaml"), "--reap-every", "60s"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    out: list[bytes] = []
    threading.Thread(target=lambda: out.extend(serve.stdout), daemon=True).start()  # type: ignore[arg-type]
    try:
        wait_until(lambda: any(b"serving " in x for x in out) or serve.poll() is not None, 90, 0.2, "tpu-ops serve")
        assert serve.poll() is None, b"".join(out).decode()[-3000:]
        yield {"env": env, "fires_at": fires_at, "output": out}
    finally:
        kill_group(serve, grace=20)
        local_stack.reset()


def test_prefect_cli_deploys_lists_and_runs(served: dict[str, Any]) -> None:
    """`prefect deploy --all` accepts prefect.yaml; `deployment ls/run`, `flow-run ls` and
    `work-pool ls` answer (not 422); a process worker runs the reaper deployment to completion."""
    env = served["env"]
    prefect(env, "work-pool", "create", "tpu-ops", "--type", "process", "--overwrite")
    prefect(env, "deploy", "--all", timeout=240)

    listed = {d["name"]: d for d in json.loads(prefect(env, "deployment", "ls", "-o", "json").stdout)}
    pooled = {n for n in listed if n.endswith("-pool")}
    assert pooled == {"pipeline-pool", "reaper-pool", "mirror-pool", "provision-pool", "run-on-slice-pool"}, listed
    assert {"scheduled-dry-run", "every-60s"} <= set(listed), "the served deployments are listed too"
    assert all(listed[n]["work_pool_name"] == "tpu-ops" for n in pooled)
    # Prefect checks parameters against the form's schema before a run exists, for every deployment.
    assert all(d["enforce_parameter_schema"] for d in listed.values()), listed
    # The documented base job templates for other pool types are accepted by the server as they are.
    for kind in ("kubernetes", "ecs", "cloud-run-v2"):
        template = json.loads((ROOT / "infra" / "work-pools" / f"{kind}.json").read_text())
        api(env, "/work_pools/", {"name": f"tpu-ops-{kind}", "type": kind, "base_job_template": template})
        stored = api(env, f"/work_pools/tpu-ops-{kind}")["base_job_template"]
        assert stored["variables"]["properties"]["image"]["default"].endswith("/tpu-ops:0.1.0")
    pools = json.loads(prefect(env, "work-pool", "ls", "-o", "json").stdout)
    assert sorted((p["name"], p["type"]) for p in pools) == [
        ("tpu-ops", "process"), ("tpu-ops-cloud-run-v2", "cloud-run-v2"), ("tpu-ops-ecs", "ecs"),
        ("tpu-ops-kubernetes", "kubernetes"),
    ]  # fmt: skip

    created = prefect(env, "deployment", "run", "reap-tpu-slices/reaper-pool", "--param", "ttl_hours=1").stdout
    run_id = re.search(r"UUID: ([0-9a-f-]{36})", created).group(1)  # type: ignore[union-attr]
    # One polling pass of a process worker on this machine: it runs what is due and waits for it.
    prefect(env, "worker", "start", "--pool", "tpu-ops", "--run-once", timeout=180)

    done = prefect(env, "flow-run", "ls", "--flow-name", "reap-tpu-slices", "--state-type", "COMPLETED", "-o", "json")
    ours = [r for r in json.loads(done.stdout) if r["id"] == run_id]
    assert ours, f"run {run_id} did not complete: {api(env, f'/flow_runs/{run_id}')['state']}"
    assert ours[0]["parameters"] == {"ttl_hours": 1} and ours[0]["work_pool_name"] == "tpu-ops"


def test_scheduled_runs_of_the_reaper_and_the_pipeline_are_created_and_complete(served: dict[str, Any]) -> None:
    """The scheduler (not the runner, not a user) creates the runs, and `tpu-ops serve` runs them."""
    env = served["env"]

    def completed(deployment: str) -> list[dict[str, Any]]:
        runs = runs_of(env, deployment)
        failed = [r for r in runs if r["state"]["type"] in ("FAILED", "CRASHED")]
        assert not failed, f"{deployment}: {failed[0]['state']}\n" + b"".join(served["output"]).decode()[-4000:]
        return [r for r in runs if r["auto_scheduled"] and r["state"]["type"] == "COMPLETED"]

    wait_until(lambda: bool(completed("reap-tpu-slices/every-60s")), 300, 1.0, "a scheduled reaper run to complete")
    # The pipeline fires once, at the minute its cron names; then it mirrors, provisions and tears down.
    budget = max(0.0, (served["fires_at"] - datetime.now(UTC)).total_seconds()) + 400
    wait_until(lambda: bool(completed("retraining-pipeline/scheduled-dry-run")), budget, 1.0, "the scheduled pipeline")
    run = completed("retraining-pipeline/scheduled-dry-run")[0]
    assert run["created_by"]["type"] == "SCHEDULE", run["created_by"]
    started = datetime.fromisoformat(run["expected_start_time"])
    assert started == served["fires_at"], (started, served["fires_at"])

    # The run's events, on its resource (the contracts' names), reached Prefect's event feed.
    run_id = next(t.removeprefix("tpu-ops-run:") for t in run["tags"] if t.startswith("tpu-ops-run:"))

    def events() -> set[str]:
        query = {"filter": {"resource": {"id": [f"tpu-ops.run.{run_id}"]}}, "limit": 50}
        return {e["event"] for e in api(env, "/events/filter", query)["events"]}

    wanted = {"tpu-ops.snapshot.committed", "tpu-ops.slice.provisioned", "tpu-ops.slice.deleted"}
    wait_until(lambda: wanted <= events(), 60, 1.0, f"events {wanted}")
    # `tpu-ops status` lists it among the deployments' runs, as started on a schedule
    listed = subprocess.run([sys.executable, "-m", "flows.cli", "status"], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=120)  # fmt: skip
    row = next((ln.split() for ln in listed.stdout.splitlines() if ln.startswith(f"{run_id} ")), [])
    assert row[1:4] == ["pipeline", "schedule", "done"], listed.stdout + listed.stderr
    # Its one slot (at most one run per pipeline name) exists and was given back.
    limit = api(env, "/v2/concurrency_limits/tpu-ops-pipeline-scheduled-dry-run")
    assert (limit["limit"], limit["active_slots"]) == (1, 0)


def test_shorthand_rungs_are_served_as_objects_and_refused_from_the_cli(served: dict[str, Any]) -> None:
    """A spec file's `spot` rungs reach the server as objects (the form's one array of typed rungs);
    the same shorthand sent straight to the server is refused before a run exists, naming the rung."""
    env = served["env"]
    doc = yaml.safe_load((ROOT / "flows" / "dryrun.yaml").read_text())
    assert "spot" in doc["provision"]["ladder"]  # the served spec file writes the shorthand
    deployment = api(env, "/deployments/name/retraining-pipeline/scheduled-dry-run")
    ladder = deployment["parameters"]["spec"]["provision"]["ladder"]
    assert all(isinstance(r, dict) for r in ladder) and {"kind": "spot"}.items() <= ladder[1].items(), ladder
    before = len(runs_of(env, "retraining-pipeline/scheduled-dry-run"))
    sent = json.dumps({"spec": doc})
    proc = subprocess.run([PREFECT, "--no-prompt", "deployment", "run", "retraining-pipeline/scheduled-dry-run",
                           "--params", sent], cwd=ROOT, env={**env, "COLUMNS": "250"}, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    said = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode != 0 and "spec.provision.ladder[" in said and "is not of type 'object'" in said, said
    assert len(runs_of(env, "retraining-pipeline/scheduled-dry-run")) == before  # refused: no run was created


def test_a_second_run_of_the_same_pipeline_is_refused_while_one_holds_its_slot(prefect_server: dict[str, str]) -> None:
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows.pipeline import one_run_at_a_time
    from tpu_ops.errors import ConfigError

    with temporary_settings({PREFECT_API_URL: prefect_server["PREFECT_API_URL"]}), one_run_at_a_time("busy"):
        t0 = time.monotonic()
        with (
            pytest.raises(ConfigError, match="pipeline 'busy' already has a run in progress"),
            one_run_at_a_time("busy", wait_s=1),
        ):
            pass
        assert time.monotonic() - t0 < 60
        with one_run_at_a_time("another"):  # other pipelines are not held up
            pass


def test_the_example_automation_is_accepted_with_a_notification_block(prefect_server: dict[str, str]) -> None:
    """examples/automations/notify-failed-retrain.yaml, pointed at a real block, as the README says."""
    from prefect.blocks.notifications import SlackWebhook
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: prefect_server["PREFECT_API_URL"]}):
        block_id = SlackWebhook(url="https://hooks.slack.com/services/T000/B000/XXXX").save(
            "tpu-ops-alerts", overwrite=True
        )
    text = (ROOT / "examples" / "automations" / "notify-failed-retrain.yaml").read_text()
    doc = yaml.safe_load(text.replace("REPLACE_WITH_BLOCK_ID", str(block_id)))
    (automation,) = doc["automations"]
    created = api(prefect_server, "/automations/", automation)
    stored = api(prefect_server, f"/automations/{created['id']}")
    assert set(stored["trigger"]["expect"]) == {"prefect.flow-run.Failed", "prefect.flow-run.Crashed"}
    assert stored["actions"][0]["block_document_id"] == str(block_id)
