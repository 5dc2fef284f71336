"""``tpu-ops capacity plan`` of a spec with elastic shapes: each shape's expected $ per kept step."""

from __future__ import annotations

import json
from typing import Any

import pytest


def test_the_plan_shows_each_shapes_cost_per_kept_step(
    gcs_env: dict[str, str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Any
) -> None:
    from flows.cli import main

    for k, v in gcs_env.items():
        monkeypatch.setenv(k, v)
    from tpu_ops.cloud.clients import storage_client
    from tpu_ops.settings import Settings

    storage_client(Settings(dry_run=True, gcs_endpoint=gcs_env["TPU_OPS_GCS_ENDPOINT"])).create_bucket("shape-plan")
    spec = tmp_path / "p.yaml"
    spec.write_text(
        "slice: {accelerator_type: v5p-32, region: us-east5, zones: [us-east5-a], shapes: [v5p-32, v5p-16, v5p-8]}\n"
        "ladder: [spot, on-demand]\nbudget_usd: 10000\nhours: 4\n"
        "choose: {history: 'gs://shape-plan/none', steps: 4000, checkpoint_every: 200}\n"
    )
    assert main(["capacity", "plan", "--spec", str(spec), "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    rows = plan["shapes"]
    assert [(r["shape"], r["chips"], r["accum_steps"]) for r in rows] == [
        ("v5p-32", 16, 1),
        ("v5p-16", 8, 2),
        ("v5p-8", 4, 4),
    ]
    # a step on half the chips takes twice as long (the same global batch), at half the price per hour
    assert [r["seconds_per_step"] for r in rows] == [3.6, 7.2, 14.4]
    assert rows[0]["usd_per_step"] == pytest.approx(plan["rungs"][0]["usd_per_step"])  # the target: the plan's own
    # the same chip-hours per step, and a little more for the longer run's expected preemptions and their recovery
    assert rows[0]["usd_per_step"] < rows[1]["usd_per_step"] < rows[2]["usd_per_step"] < 1.2 * rows[0]["usd_per_step"]
    assert all(r["first_rung"] == "spot in us-east5-a" for r in rows)
    assert main(["capacity", "plan", "--spec", str(spec)]) == 0
    text = capsys.readouterr().out
    assert "shapes (target first" in text and "v5p-16" in text


def test_a_deadline_already_past_is_named_not_only_shown_as_p_miss_100(
    gcs_env: dict[str, str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Any
) -> None:
    """examples/nightly-auto.yaml's fixed finish_by passed: each rung read P(miss) 100.0%, with no word why."""
    from flows.cli import main

    for k, v in gcs_env.items():
        monkeypatch.setenv(k, v)
    from tpu_ops.cloud.clients import storage_client
    from tpu_ops.settings import Settings

    gcs = storage_client(Settings(dry_run=True, gcs_endpoint=gcs_env["TPU_OPS_GCS_ENDPOINT"]))
    if gcs.lookup_bucket("past-plan") is None:
        gcs.create_bucket("past-plan")
    spec = tmp_path / "p.yaml"
    body = ("slice: {accelerator_type: v5p-8, region: us-east5, zones: [us-east5-a]}\nladder: [spot, on-demand]\n"
            "budget_usd: 10000\nhours: 4\nchoose: {history: 'gs://past-plan/none', steps: 400, checkpoint_every: 200, "
            "finish_by: '%s'}\n")  # fmt: skip
    spec.write_text(body % "2026-01-01T06:00:00Z")
    assert main(["capacity", "plan", "--spec", str(spec)]) == 0
    text = capsys.readouterr().out
    assert text.startswith("note: choose.finish_by 2026-01-01T06:00:00+00:00 has passed: every rung misses it"), text
    assert main(["capacity", "plan", "--spec", str(spec), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["note"].startswith("choose.finish_by 2026-01-01T06:00:00+00:00 has")
    spec.write_text(body % "2999-01-01T06:00:00Z")
    assert main(["capacity", "plan", "--spec", str(spec)]) == 0
    assert "has passed" not in capsys.readouterr().out
