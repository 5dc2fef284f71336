"""``tpu-ops train`` and the ``train`` flow: bad specs are refused before any cloud call; a good one trains."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from train_helpers import job_spec

from flows.cli import main

pytestmark = pytest.mark.usefixtures("nothing_left")


@pytest.fixture
def cli_env(stack: Any, train_settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in stack.env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("TPU_OPS_STATE_DIR", str(train_settings.state_dir))
    monkeypatch.setenv("TPU_OPS_POLL_INTERVAL_S", "0.1")


def _run_objects(gcs: Any, bucket: str) -> list[str]:
    """What a run wrote to the bucket (the wheelhouse the fixture put there is not the run's)."""
    return [b.name for b in gcs.list_blobs(bucket) if not b.name.startswith("wheelhouse/")]


def _spec_file(tmp_path: Path, doc: dict[str, Any]) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _good(bucket: str) -> dict[str, Any]:
    return json.loads(job_spec(bucket, steps=10, checkpoint_every=5).model_dump_json())


BAD = [
    ("train.steps", 0, "train.steps"),
    ("train.command", [], "train.command"),
    ("train.poll_interval", "1d", "train.poll_interval"),
    ("train.checkpoint_dir", "s3://not-gcs/x", "train.checkpoint_dir"),
    ("provision.budget_usd", 0.001, "over budget"),
]


@pytest.mark.parametrize(("path", "value", "words"), BAD, ids=[b[0] for b in BAD])
def test_cli_refuses_bad_specs_before_any_cloud_call(
    stack: Any, gcs: Any, ckpt_bucket: str, cli_env: None, tmp_path: Path, capsys: Any,
    path: str, value: Any, words: str,
) -> None:  # fmt: skip
    doc = _good(ckpt_bucket)
    section, field = path.split(".")
    doc[section][field] = value
    stack.add_fault(".", 500, 1)  # consumed by any call that reaches the TPU API
    code = main(["train", "--spec", str(_spec_file(tmp_path, doc)), "--run-id", "bad-spec", "--no-flow"])
    assert code in (1, 2)
    assert words in capsys.readouterr().err
    assert stack.state()["faults_pending"] == 1
    assert _run_objects(gcs, ckpt_bucket) == []


def test_cli_refuses_a_bad_run_id(stack: Any, ckpt_bucket: str, cli_env: None, tmp_path: Path, capsys: Any) -> None:
    stack.add_fault(".", 500, 1)
    assert main(["train", "--spec", str(_spec_file(tmp_path, _good(ckpt_bucket))), "--run-id", "Bad;id"]) == 2
    assert "run id" in capsys.readouterr().err and stack.state()["faults_pending"] == 1


def test_a_refused_second_train_flow_leaves_the_running_supervisors_slice_alone(
    stack: Any, gcs: Any, ckpt_bucket: str, cli_env: None, prefect_api: None, train_settings: Any
) -> None:
    from train_helpers import Run, live_node, wait_for

    from flows.train import train
    from tpu_ops.train.runstate import LeaseHeldError

    job = job_spec(ckpt_bucket, steps=40, checkpoint_every=10)
    first = Run(job, "fenced", train_settings)
    node = wait_for(lambda: live_node(train_settings, "fenced"), what="the first supervisor's slice")
    with pytest.raises(LeaseHeldError, match="another supervisor holds this run"):
        train(spec=json.loads(job.model_dump_json()), run_id="fenced")
    assert live_node(train_settings, "fenced") == node  # the failure hook did not tear it down
    report = first.result()
    assert report.outcome == "done" and report.final_step == 40 and report.preemptions == []


def test_train_flow_refuses_a_bad_spec_then_trains_a_good_one(
    stack: Any, gcs: Any, ckpt_bucket: str, cli_env: None, prefect_api: None, tmp_path: Path, capsys: Any
) -> None:
    from flows.train import train

    bad = _good(ckpt_bucket)
    bad["train"]["checkpoint_every"] = 50  # larger than steps
    stack.add_fault(".", 500, 1)
    with pytest.raises(Exception, match="checkpoint_every"):
        train(spec=bad, run_id="flow-bad")
    assert stack.state()["faults_pending"] == 1 and _run_objects(gcs, ckpt_bucket) == []
    stack.backend.reset()

    code = main(["train", "--spec", str(_spec_file(tmp_path, _good(ckpt_bucket))), "--run-id", "flow-ok", "--json"])
    assert code == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["outcome"] == "done" and doc["final_step"] == 10 and doc["recoveries"] == 0
    assert doc["cost"]["usd_by_tier"]["spot"] > 0

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
    from prefect.client.schemas.sorting import ArtifactSort

    # By key alone: a flow or task run filter, even empty, joins the artifact to its task run, which the server
    # records from the client's events; under load those can be dropped (seen once: "EventsWorker failed").
    with get_client(sync_client=True) as client:
        found = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["goodput-flow-ok"])),
            sort=ArtifactSort.CREATED_DESC, limit=5, offset=0,
        )
    assert found and found[0].type == "table" and "goodput" in (found[0].description or "")


def test_maxtext_run_name_must_be_the_run_id(stack: Any, cli_env: None, capsys: Any) -> None:
    from pathlib import Path as P

    spec = P(__file__).resolve().parents[2] / "examples" / "maxtext.yaml"
    stack.add_fault(".", 500, 1)
    assert main(["train", "--spec", str(spec), "--run-id", "other-run", "--no-flow"]) == 2
    assert "run_name=llm-ft-001" in capsys.readouterr().err and stack.state()["faults_pending"] == 1
