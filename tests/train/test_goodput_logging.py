"""Readable by Google's tools: worker 0's Cloud Logging entries (the local fake), read back by
``ml-goodput-measurement``'s own ``GoodputCalculator``, give the goodput tpu-ops reports."""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any

import pytest
from train_helpers import Run, job_spec, live_node, wait_for

from infra.local.cloudlogging.server import LoggingBackend, matches, parse
from tpu_ops.agent.goodput_hooks import GoodputLogWriter
from tpu_ops.errors import ConfigError
from tpu_ops.run import Run as TpuOpsRun
from tpu_ops.train.checkpoints import latest_complete_step
from tpu_ops.train.supervisor import Supervisor


def _calculator(stack: Any, run_id: str, cache: Path) -> Any:
    """Google's calculator with its own reader (``_CloudLogger.read_cloud_logging_entries``: its filter,
    its ordering), only the logging client pointed at the fake instead of built with defaults."""
    from google.cloud import logging as cloud_logging
    from ml_goodput_measurement.src import goodput as mgm

    client = cloud_logging.Client(project=stack.project, credentials=stack.google_credentials(), _use_grpc=False,
                                  client_options={"api_endpoint": stack.logging_endpoint})  # fmt: skip
    reader = mgm._CloudLogger.__new__(mgm._CloudLogger)  # its __init__ builds a default client: the only difference
    reader.job_name, reader.log_name, reader.project_id = run_id, f"goodput_{run_id}", stack.project
    reader.logger, reader.job_start_time = client.logger(reader.log_name), None
    reader.retention_period = datetime.timedelta(days=7)
    return mgm.GoodputCalculator(run_id, f"goodput_{run_id}", cloud_logger=reader, cache_dir=str(cache))


@pytest.mark.usefixtures("nothing_left")
@pytest.mark.parametrize("preempt", [False, True], ids=["uninterrupted", "one-preemption"])
def test_googles_calculator_reads_our_entries_and_agrees_within_one_point(
    stack: Any, gcs: Any, ckpt_bucket: str, train_settings: Any, tmp_path: Path, preempt: bool
) -> None:
    run_id = "gp-log-p" if preempt else "gp-log"
    # long enough that the final save (Google's calculator counts everything after the last step's start as
    # productive; tpu-ops counts that save as checkpoint time) stays a small part of the wall time
    job = job_spec(ckpt_bucket, steps=160, checkpoint_every=20, goodput_logging=True)
    run = Run(job, run_id, train_settings)
    if preempt:  # mid-interval, so steps after the last commit are re-run (how the library sees a disruption)
        wait_for(lambda: (latest_complete_step(gcs, f"gs://{ckpt_bucket}/runs/{run_id}") or 0) >= 20, 60)
        progress = f"runs/{run_id}/_tpu_ops/heartbeats/worker-0.json"
        wait_for(lambda: (json.loads(gcs.bucket(ckpt_bucket).blob(progress).download_as_bytes()).get("step") or 0)
                 >= 30, 60, what="step 30")  # fmt: skip
        stack.preempt("us-central2-b", wait_for(lambda: live_node(train_settings, run_id)))
    report = run.result().to_json()
    assert report["outcome"] == "done" and report["recoveries"] == (1 if preempt else 0)
    assert report["steps_kept"] == report["final_step"] == 160
    google, breakdown, last_step = _calculator(stack, run_id, tmp_path).get_job_goodput(include_badput_breakdown=True)
    assert last_step == 160
    print(f"goodput: tpu-ops {100 * report['goodput']:.2f}%, ml-goodput-measurement {google:.2f}%")
    assert abs(google - 100 * report["goodput"]) <= 1.0, (google, report, breakdown)


def test_the_fake_answers_the_librarys_filter() -> None:
    backend = LoggingBackend()
    entry = {"logName": "projects/p/logs/goodput_r", "severity": "INFO", "timestamp": "2026-11-23T10:00:01Z",
             "jsonPayload": {"job_name": "r", "step_count": 3}}  # fmt: skip
    backend.write({"entries": [entry, {**entry, "jsonPayload": {"job_name": "other"}}]})
    query = ('logName="projects/p/logs/goodput_r" AND severity=INFO AND jsonPayload.job_name="r" AND '
             'timestamp<="2026-11-23T10:00:05+00:00" AND (timestamp > "2026-11-23T10:00:00+00:00" OR '
             '(timestamp = "2026-11-23T10:00:00+00:00" AND insertId > "000000000001")) AND '
             "logName=projects/p/logs/goodput_r")  # fmt: skip
    found = backend.list({"resourceNames": ["projects/p"], "filter": query})["entries"]
    assert [e["jsonPayload"]["job_name"] for e in found] == ["r"]
    assert not matches(parse('timestamp>"2026-11-23T10:00:02Z"'), found[0])
    assert backend.list({"resourceNames": ["projects/q"], "filter": ""})["entries"] == []


def test_a_dry_run_refuses_a_logging_endpoint_off_loopback(stack: Any, ckpt_bucket: str, train_settings: Any) -> None:
    job = job_spec(ckpt_bucket, goodput_logging=True)
    google = "https://logging.googleapis.com"
    with pytest.raises(ConfigError, match="logging_endpoint"):
        Supervisor(job, TpuOpsRun.of_job("gp-off", train_settings.model_copy(update={"logging_endpoint": google}), job))
    conf = {"job_name": "r", "logger_name": "goodput_r", "project": "p"}
    with pytest.raises(ValueError, match="loopback"):  # the agent's own check, on the worker
        GoodputLogWriter(conf, 0, lambda path: "{}", google, dry_run=True)
    assert GoodputLogWriter(conf, 0, lambda path: "{}", None, dry_run=False).endpoint == google
