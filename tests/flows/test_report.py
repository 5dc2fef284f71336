"""The run's own account of itself: tables by tier, ladder, goodput, lineage, the dry run's glance."""

from __future__ import annotations

from typing import Any

from flows.report import (
    cost_rows,
    glance_markdown,
    glance_rows,
    glance_text,
    ladder_rows,
    lineage_markdown,
    winning_rung,
)

ATTEMPTS = [
    {"number": 1, "tier": "reserved", "reservation": "fraud-v4", "zone": "us-central2-b", "resource_id": "r-a1",
     "outcome": "stockout", "seconds_waited": 2.71, "detail": "no reservation capacity"},
    {"number": 2, "tier": "spot", "zone": "us-central2-b", "resource_id": "r-a2", "outcome": "stockout",
     "seconds_waited": 2.7},
    {"number": 3, "tier": "spot", "zone": "us-central2-c", "resource_id": "r-a3", "outcome": "active",
     "seconds_waited": 0.1},
    {"number": 4, "tier": "spot", "zone": "us-central2-c", "resource_id": "r-a4", "outcome": "active",
     "seconds_waited": 0.3},
]  # fmt: skip
SUMMARY: dict[str, Any] = {
    "run_id": "dry-run-1",
    "snapshot_id": "ds-abc",
    "manifest": "gs://d/fraud/_tpu_ops/manifests/ds-abc.json",
    "objects_copied": 17,
    "checkpoints": "gs://c/fraud/dry-run-1",
    "ladder": ATTEMPTS,
    "training": {"outcome": "done", "final_step": 1000, "steps": 1000, "goodput": 0.8123, "wall_s": 20.0,
                 "productive_s": 16.2, "recoveries": 1},
    "preemptions": [{"number": 1, "reason": "node PREEMPTED", "steps_lost": 40, "resume_step": 300,
                     "overhead_s": 3.2}],
    "cost": {"chip_hours_by_tier": {"spot": 0.0168, "on-demand": 0.002}, "usd_by_tier": {"spot": 0.0244,
             "on-demand": 0.01}, "usd_total": 0.0344},
    "export": {"package_arn": "arn:aws:sagemaker:us-east-1:123456789012:model-package/fraud-model/1",
               "source": {"kind": "checkpoint", "uri": "gs://c/fraud/dry-run-1/60", "step": 60},
               "artifact": {"uri": "s3://m/fraud/dry-run-1/model.tar.gz", "sha256": "f00d"}},
    "audit": {"verify": "OK", "records": 12},
    "left_behind": {"tpu_resources": 0, "worker_processes": 0},
    "seconds": 61.2,
}  # fmt: skip


def test_cost_is_a_table_by_tier_with_a_total() -> None:
    rows = cost_rows(SUMMARY["cost"])
    assert [r["tier"] for r in rows] == ["on-demand", "spot", "total"]
    assert rows[1] == {"tier": "spot", "chip-hours": "0.0168", "USD": "0.0244"}
    assert rows[-1]["USD"] == "0.0344" and rows[-1]["chip-hours"] == "0.0188"


def test_ladder_rows_and_the_winning_rung() -> None:
    rows = ladder_rows(ATTEMPTS)
    assert [r["rung"] for r in rows] == ["reservation fraud-v4", "spot", "spot", "spot"]
    assert rows[0]["outcome"] == "stockout" and rows[0]["waited (s)"] == "2.7"
    # after a preemption the ladder is climbed again: the last slice is the one that won
    assert winning_rung(ATTEMPTS) == "spot in us-central2-c (r-a4)"
    assert winning_rung(ATTEMPTS[:2]) == "-"


def test_the_glance_names_everything_a_person_checks() -> None:
    rows = dict(glance_rows(SUMMARY))
    assert rows["snapshot"].startswith("ds-abc")
    assert rows["winning rung"] == "spot in us-central2-c (r-a4)"
    assert rows["preemptions / recoveries"] == "1 / 1"
    assert rows["steps lost"] == "40"
    assert rows["goodput"] == "81.2%"
    assert rows["cost by tier"] == "on-demand $0.0100, spot $0.0244 (total $0.0344)"
    assert rows["model package"].endswith("model-package/fraud-model/1")
    assert rows["audit verify"] == "OK"
    assert rows["left behind"] == "nothing"
    text = glance_text(glance_rows(SUMMARY))
    lines = text.splitlines()
    assert len({len(line) for line in lines}) == 1  # a box: every line as wide as the others
    assert "| audit verify" in text and "{" not in text  # no raw dicts
    md = glance_markdown(glance_rows(SUMMARY), "Run")
    assert "| goodput | 81.2% |" in md


def test_a_pipeline_run_without_a_verification_names_its_audit_record() -> None:
    export = {**SUMMARY["export"], "audit_head": {"seq": 7, "hash": "ab"}}
    rows = dict(glance_rows({**SUMMARY, "audit": {}, "export": export}))
    assert rows["audit verify"] == "package names audit record 7 (check: tpu-ops audit verify)"
    assert dict(glance_rows({**SUMMARY, "audit": {}, "export": None}))["audit verify"] == "-"


def test_something_left_behind_is_said_plainly() -> None:
    rows = dict(glance_rows({**SUMMARY, "left_behind": {"tpu_resources": 2, "worker_processes": 0}}))
    assert rows["left behind"] != "nothing" and "2" in rows["left behind"]


def test_lineage_links_dataset_to_model_package() -> None:
    md = lineage_markdown(SUMMARY)
    assert "`gs://c/fraud/dry-run-1/60` (checkpoint, step 60)" in md and "{" not in md
    order = [
        "ds-abc",
        "gs://c/fraud/dry-run-1",
        "dry-run-1/60",
        "model.tar.gz",
        "f00d",
        "model-package/fraud-model/1",
        "OK",
    ]
    positions = [md.index(x) for x in order]
    assert positions == sorted(positions)


def test_run_progress_moves_through_stages_and_a_watched_step(prefect_api: None) -> None:
    import threading
    from uuid import UUID

    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, ArtifactFilterKey
    from prefect.runtime import flow_run

    from flows.report import RunProgress

    def mine(run_id: str) -> ArtifactFilter:  # the session's server holds other tests' pipelines' progress too
        return ArtifactFilter(key=ArtifactFilterKey(any_=["pipeline-progress"]),
                              flow_run_id=ArtifactFilterFlowRunId(any_=[UUID(run_id)]))  # fmt: skip

    seen: list[float] = []
    polled = threading.Event()

    def poll() -> tuple[float, str]:
        seen.append(0.5)
        polled.set()
        return 0.5, "step 500/1000"

    @flow
    def run() -> str:
        progress = RunProgress("r-1")
        progress.stage("mirror", 0, 20)
        progress.stage("training", 20, 90)
        progress.watch(poll, every_s=0.05)
        assert polled.wait(10)
        progress.unwatch()
        with get_client(sync_client=True) as client:
            mid = client.read_artifacts(artifact_filter=mine(flow_run.id))
        progress.done()
        return f"{float(mid[0].data)}|{mid[0].description}|{flow_run.id}"

    mid, _, run_id = run().rpartition("|")
    assert mid == "55.0|run r-1: training step 500/1000"  # halfway through the 20..90 stage
    with get_client(sync_client=True) as client:
        [art] = client.read_artifacts(artifact_filter=mine(run_id))
    assert art.type == "progress" and art.data == 100.0 and art.description == "run r-1: done"


def test_the_ladder_table_says_which_incarnation_each_attempt_was_for() -> None:
    from flows.report import incarnations

    walks = [{"number": n} for n in (1, 2, 3, 1, 2, 3, 1)]  # each walk of the ladder numbers from 1
    assert incarnations(walks) == [0, 0, 0, 1, 1, 1, 2]
    rows = ladder_rows([{**a, "tier": "spot"} for a in walks])
    assert [r["incarnation"] for r in rows][2:4] == ["0 (first)", "1 (after preemption 1)"]
    assert next(iter(rows[0])) == "incarnation"


def test_recovery_is_one_log_line_per_step() -> None:
    from flows.report import RecoveryLog

    lines: list[str] = []
    log = RecoveryLog(lines.append)
    log.event("tpu-ops.slice.provisioned", {"incarnation": 0, "tier": "spot", "zone": "z-c", "resume_step": None})
    log.attempt("#1 spot in z-b: active")
    log.event("tpu-ops.slice.preempted", {"preemption": 1, "reason": "node PREEMPTED", "tier": "spot",
                                          "queued_resource": "r-a3", "zone": "z-c", "last_step": 30})  # fmt: skip
    log.attempt("#1 spot in z-b: stockout")
    log.attempt("#2 spot in z-c: active")
    log.event("tpu-ops.slice.provisioned", {"incarnation": 1, "tier": "spot", "zone": "z-c",
                                            "queued_resource": "r-a2", "resume_step": 30})  # fmt: skip
    log.event("tpu-ops.slice.recovered", {"preemption": 1, "step": 31})
    assert lines == [
        "attempt #1 spot in z-b: active",
        "preemption 1: node PREEMPTED (spot r-a3 in z-c, last step 30) → deleting the slice",
        "preemption 1: slice deleted → re-provisioning through the ladder",
        "attempt #1 spot in z-b: stockout",
        "attempt #2 spot in z-c: active",
        "recovery: incarnation 1 on spot in z-c (r-a2) → resuming from step 30",
        "preemption 1: recovered, training again at step 31",
    ]


def test_what_was_left_behind_reads_as_words() -> None:
    from flows.report import left_behind

    assert left_behind({"tpu_resources": 0, "worker_processes": 0}) == "nothing"
    assert left_behind({"tpu_resources": 2, "worker_processes": 1}) == "2 TPU resources, 1 worker process"
    assert left_behind({"worker_processes": 3}) == "3 worker processes"
    assert "teardown" in left_behind({"unconfirmed": True})
    rows = dict(glance_rows(SUMMARY))
    assert "took" not in rows, "the UI's summary and the dry run's table have the same rows"
    assert not any("{" in v for v in rows.values()), rows  # no Python reprs


def test_a_recovery_on_another_shape_names_it() -> None:
    from flows.report import RecoveryLog

    lines: list[str] = []
    log = RecoveryLog(lines.append)
    log.event("tpu-ops.slice.provisioned", {"incarnation": 1, "tier": "spot", "zone": "z-b", "queued_resource": "r-a1",
                                            "resume_step": 13, "shape": "v5p-16"})  # fmt: skip
    assert lines == ["recovery: incarnation 1 on spot in z-b (r-a1, v5p-16) → resuming from step 13"]


def test_the_glance_names_each_shape_and_its_steps() -> None:
    from flows.report import glance_rows

    shapes = [
        {"shape": "v5p-32", "steps": 49, "held_chip_s": 446.8},
        {"shape": "v5p-16", "steps": 11, "held_chip_s": 56.5},
    ]
    rows = dict(glance_rows({"run_id": "r", "training": {"final_step": 60, "steps": 60}, "shapes": shapes}))
    assert rows["shapes"] == "v5p-32 49 steps, v5p-16 11 steps; chip-seconds held 503"
    assert "shapes" not in dict(glance_rows({"run_id": "r", "training": {"final_step": 60, "steps": 60}}))
