"""Issue 31, point 1: a run over budget is refused before its first billable call.

The pipeline's S3 traffic (mirror source, audit trail) goes through a counting TCP proxy on
loopback in front of moto: an over-budget pipeline must send it nothing at all, and fail on one
line with the figures and the fix (no traceback in the flow's log, no "failed at step None").
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tpu_ops.cloud.clients import boto3_client
from tpu_ops.settings import Settings
from tpu_ops.specs import PipelineSpec, TrainJobSpec, load_spec, parse_spec

ROOT = Path(__file__).resolve().parents[2]


class CountingProxy:
    """Forwards loopback connections to ``upstream_port``, counting connections and request bytes."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream = upstream_port
        self.connections = 0
        self.bytes_sent = 0
        self._lock = threading.Lock()
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._sock.accept()
            except OSError:
                return
            with self._lock:
                self.connections += 1
            upstream = socket.create_connection(("127.0.0.1", self.upstream))
            threading.Thread(target=self._pipe, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, False), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, counted: bool) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                if counted:
                    with self._lock:
                        self.bytes_sent += len(data)
                dst.sendall(data)
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._sock.close()


@pytest.fixture
def counted_s3(stack: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[CountingProxy]:
    """The stack's environment, with every AWS call going through a counting proxy."""
    from urllib.parse import urlsplit

    for name, value in stack.env().items():
        monkeypatch.setenv(name, value)
    proxy = CountingProxy(int(urlsplit(stack.aws_endpoint).port or 0))
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
    monkeypatch.setenv("TPU_OPS_AWS_ENDPOINT_URL", proxy.url)
    monkeypatch.setenv("TPU_OPS_STATE_DIR", str(tmp_path / "state"))
    yield proxy
    proxy.close()


def _over_budget(doc: dict[str, Any]) -> dict[str, Any]:
    doc["provision"]["budget_usd"] = 1  # v4-32 (16 chips) x 6 h on on-demand is far more than $1
    return doc


def _the_counter_counts(proxy: CountingProxy) -> int:
    """One S3 call through the proxy is seen (so a zero later means no call, not a blind counter)."""
    boto3_client(Settings(), "s3").list_buckets()
    assert proxy.connections >= 1 and proxy.bytes_sent > 0
    return proxy.bytes_sent


@pytest.mark.usefixtures("prefect_api")
def test_a_pipeline_over_budget_sends_nothing_to_s3(counted_s3: CountingProxy) -> None:
    from flows.pipeline import retraining_pipeline

    doc = _over_budget(load_spec(ROOT / "flows" / "dryrun.yaml", PipelineSpec).model_dump(mode="json"))
    before = _the_counter_counts(counted_s3)
    connections = counted_s3.connections
    records: list[logging.LogRecord] = []
    seen = logging.Handler()
    seen.emit = records.append  # type: ignore[method-assign]
    flow_log = logging.getLogger("prefect.flow_runs")  # the flow run's log, as the UI shows it
    flow_log.addHandler(seen)
    try:
        state = retraining_pipeline(spec=doc, return_state=True)  # as the UI sends it
    finally:
        flow_log.removeHandler(seen)
    assert state.is_failed()
    assert (counted_s3.connections, counted_s3.bytes_sent) == (connections, before), "S3 was called"
    message = state.message or ""
    assert message.startswith("over budget: estimated cost $"), message
    assert "exceeds the budget $1.00" in message and "v4-32" in message
    assert "fix: raise provision.budget_usd to at least $" in message and "\n" not in message
    errors = [r.getMessage() for r in records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and errors[0] == message, errors
    assert not any(r.exc_info for r in records), "a traceback in the flow's log"
    assert not any("step None" in r.getMessage() for r in records)


@pytest.mark.usefixtures("prefect_api")
def test_the_train_flow_over_budget_sends_nothing_to_s3(counted_s3: CountingProxy) -> None:
    from flows.train import train

    doc = _over_budget(load_spec(ROOT / "flows" / "dryrun.yaml", PipelineSpec).model_dump(mode="json"))
    job = parse_spec(TrainJobSpec, {"provision": doc["provision"], "train": doc["train"]}, what="job")
    before = _the_counter_counts(counted_s3)
    state = train(job, "budget-train", return_state=True)
    assert state.is_failed() and (state.message or "").startswith("over budget:"), state.message
    assert counted_s3.bytes_sent == before


def _spec_over(tmp_path: Path, source: Path, budget: str) -> Path:
    path = tmp_path / source.name
    path.write_text(source.read_text().replace(budget, "budget_usd: 5"))
    return path


def test_validate_and_cost_say_over_budget_with_the_figures_and_the_fix(tmp_path: Path, capsys: Any) -> None:
    from flows.cli import main

    pipeline = _spec_over(tmp_path, ROOT / "flows" / "dryrun.yaml", "budget_usd: 500")
    assert main(["validate", str(pipeline)]) == 1
    err = capsys.readouterr().err
    assert "over budget: estimated cost $309.12 exceeds the budget $5.00" in err, err
    assert "fix: raise provision.budget_usd to at least $309.12, or shrink the run" in err, err
    assert main(["cost", "--spec", str(pipeline)]) == 1
    out = capsys.readouterr().out
    assert "worst case $309.12" in out and "over budget:" in out and "fix: raise provision.budget_usd" in out, out
    provision = _spec_over(tmp_path, ROOT / "examples" / "provision.yaml", "budget_usd: 200")
    assert main(["cost", "--spec", str(provision)]) == 1
    assert "exceeds the budget $5.00" in (out := capsys.readouterr().out) and "fix: raise budget_usd to" in out, out
    assert main(["validate", str(provision)]) == 1 and "over budget" in capsys.readouterr().err
    # within budget: ok, and cost says so
    assert main(["validate", str(ROOT / "flows" / "dryrun.yaml")]) == 0
    assert main(["cost", "--spec", str(ROOT / "flows" / "dryrun.yaml")]) == 0
    assert "within the budget $500.00 (provision.budget_usd)" in capsys.readouterr().out


def test_a_dry_run_over_budget_starts_nothing(tmp_path: Path, capsys: Any) -> None:
    from flows.cli import main

    pipeline = _spec_over(tmp_path, ROOT / "flows" / "dryrun-compute.yaml", "budget_usd: 500")
    assert "budget_usd: 5\n" in pipeline.read_text()
    assert main(["dry-run", "--spec", str(pipeline), "--workdir", str(tmp_path / "dr")]) == 1
    assert "over budget:" in capsys.readouterr().err
    assert not (tmp_path / "dr").exists()


@pytest.mark.usefixtures("prefect_api")
def test_the_provision_flows_over_budget_send_nothing_to_s3(counted_s3: CountingProxy) -> None:
    from flows.provision import provision_slice, run_on_slice
    from tpu_ops.specs import ProvisionSpec

    doc = _over_budget(load_spec(ROOT / "flows" / "dryrun.yaml", PipelineSpec).model_dump(mode="json"))
    spec = parse_spec(ProvisionSpec, doc["provision"], what="provision")
    before = _the_counter_counts(counted_s3)
    for flow in (provision_slice, run_on_slice):
        state = flow(spec, "budget-slice", return_state=True)
        assert state.is_failed() and (state.message or "").startswith("over budget:"), state.message
        assert "fix: raise budget_usd to at least $" in (state.message or "")
    assert counted_s3.bytes_sent == before
