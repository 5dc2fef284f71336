"""Runs started in the Prefect UI or on a schedule (:mod:`flows.commands._ui_runs`), without a server: a flow
run's parameters become the record ``launch`` would have written; no Prefect API configured changes nothing;
one that does not answer is one line, quickly."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import uuid4

import pytest
from prefect.client.schemas.objects import FlowRun
from prefect.settings import PREFECT_API_URL, temporary_settings
from prefect.states import Completed, Failed, Running

from flows.cli import main
from flows.commands import _ui_runs
from tpu_ops.specs import PipelineSpec, ProvisionSpec, TrainJobSpec, load_spec

ROOT = Path(__file__).resolve().parents[2]
TRAIN = load_spec(ROOT / "examples" / "local-train.yaml", TrainJobSpec)
PIPELINE = load_spec(ROOT / "flows" / "dryrun.yaml", PipelineSpec)


def _flow_run(params: dict[str, Any], tags: list[str] | None = None, state: Any = None) -> FlowRun:
    return FlowRun(flow_id=uuid4(), parameters=params, tags=tags or [], state=state or Running())


def test_a_train_run_from_the_ui_is_the_record_launch_writes() -> None:
    from tpu_ops.train.launches import from_spec

    fr = _flow_run({"spec": TRAIN.model_dump(mode="json"), "run_id": "ui-train"})
    got = _ui_runs.record_of("train", fr, "http://127.0.0.1:4200")
    want = from_spec("train-job", TRAIN, "ui-train")  # what `launch` records
    assert got is not None
    for field in ("run_id", "kind", "checkpoint_dir", "checkpoint_subdir", "zones", "hosts", "accelerator", "slices",
                  "heartbeat_s", "max_duration_s"):  # fmt: skip
        assert getattr(got, field) == getattr(want, field), field
    assert (got.checkpoint_dir, got.hosts, got.zones) == ("gs://dryrun-tpu-checkpoints/walk", 2, ["us-central2-b"])
    assert (got.mode, got.flow_run_id, got.origin) == ("prefect", str(fr.id), "ui")
    assert got.ui_url == f"http://127.0.0.1:4200/runs/flow-run/{fr.id}"
    assert got.layout is not None and got.layout.run_uri == "gs://dryrun-tpu-checkpoints/walk/ui-train"


def test_a_pipeline_run_id_comes_from_its_spec_else_from_its_tag() -> None:
    doc = PIPELINE.model_dump(mode="json")
    untagged = _flow_run({"spec": {**doc, "run_id": None}})
    assert _ui_runs.record_of("retraining-pipeline", untagged) is None  # a scheduled run: no id yet
    tagged = _flow_run({"spec": {**doc, "run_id": None}}, tags=["tpu-ops", "tpu-ops-run:nightly-260101-020000"])
    record = _ui_runs.record_of("retraining-pipeline", tagged)
    assert record is not None and (record.run_id, record.kind) == ("nightly-260101-020000", "pipeline")
    assert record.checkpoint_dir == str(PIPELINE.train.checkpoint_dir) and record.hosts == 4
    assert record.origin == "ui"
    scheduled = _flow_run({"spec": {**doc, "run_id": None}}, tags=["tpu-ops-run:nightly-260102-020000"])
    scheduled.auto_scheduled = True  # what a deployment's schedule creates
    record = _ui_runs.record_of("retraining-pipeline", scheduled)
    assert record is not None and record.origin == "schedule"
    launched = _flow_run({"spec": {**doc, "run_id": "l-1"}}, tags=["tpu-ops-run:l-1", "tpu-ops-launch"])
    assert _ui_runs.record_of("retraining-pipeline", launched).origin == "launch"  # type: ignore[union-attr]
    from flows.commands.status import detail, table
    from tpu_ops.train.status import RunStatus

    s = RunStatus(record.run_id, "pipeline", "prefect", "running", 0.0, origin=record.origin)
    assert table([s]).splitlines()[1].split()[:4] == ["nightly-260102-020000", "pipeline", "schedule", "running"]
    assert detail(s).startswith("run nightly-260102-020000 (pipeline, started on a schedule ")
    named = _flow_run({"spec": {**doc, "run_id": "fixed-id"}}, tags=["tpu-ops-run:fixed-id"])
    assert _ui_runs.record_of("retraining-pipeline", named).run_id == "fixed-id"  # type: ignore[union-attr]


def test_a_provision_run_ends_with_its_flow_run_and_other_flows_are_not_runs() -> None:
    spec = load_spec(ROOT / "examples" / "provision.yaml", ProvisionSpec)
    fr = _flow_run({"spec": spec.model_dump(mode="json"), "run_id": "ui-slice"}, state=Failed(message="stock-out"))
    record = _ui_runs.record_of("provision-slice", fr)
    assert record is not None and (record.kind, record.checkpoint_dir, record.layout) == ("provision", "", None)
    assert (record.outcome, record.error) == ("failed", "stock-out")
    assert record.zones == list(spec.slice.zones)
    assert _ui_runs.record_of("reap-tpu-slices", _flow_run({"ttl_hours": 72.0})) is None
    assert _ui_runs.record_of("train", _flow_run({"spec": {}, "run_id": "Not An Id"})) is None


def test_a_run_whose_spec_was_refused_shows_its_flow_runs_end(tmp_path: Path) -> None:
    from tpu_ops.settings import Settings
    from tpu_ops.train.status import run_status

    fr = _flow_run({"spec": {"train": {}}, "run_id": "ui-bad"}, state=Failed(message="invalid spec: spec.provision"))
    record = _ui_runs.record_of("train", fr)
    assert record is not None and record.layout is None
    s = run_status(Settings(state_dir=tmp_path), record, None)
    assert (s.state, s.error) == ("failed", "invalid spec: spec.provision")
    assert _ui_runs.end_of(Completed()) == ("done", "") and _ui_runs.end_of(Running()) is None


@pytest.fixture
def shell(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A shell with no endpoint settings (nothing is probed) and an empty state directory."""
    for var in ("TPU_OPS_GCS_ENDPOINT", "TPU_OPS_TPU_ENDPOINT", "TPU_OPS_COMPUTE_ENDPOINT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("TPU_OPS_STATE_DIR", str(tmp_path / "state"))
    return tmp_path / "state"


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_without_a_prefect_api_status_and_find_are_as_before(shell: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with temporary_settings(restore_defaults={PREFECT_API_URL}):
        assert _run(capsys, "status") == (0, f"no runs launched with state directory {shell} "
                                             "(tpu-ops launch SPEC starts one)\n", "")  # fmt: skip
        assert _run(capsys, "status", "never-ran") == (2, "", (
            f"error: no run never-ran launched with state directory {shell} (`tpu-ops status` lists the runs; "
            "TPU_OPS_STATE_DIR picks another directory)\n"))  # fmt: skip


@pytest.fixture
def silent_api() -> Iterator[str]:
    """A Prefect API URL where a socket accepts connections and never answers."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/api"


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_an_unreachable_api_is_one_line(shell: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{_closed_port()}/api"
    with temporary_settings({PREFECT_API_URL: url}):
        code, out, err = _run(capsys, "status")
        assert (code, out) == (0, f"no runs launched with state directory {shell} (tpu-ops launch SPEC starts one)\n")
        assert err.startswith(f"runs started in the Prefect UI or on a schedule not listed: the Prefect API at {url} "
                              "did not answer (ConnectError")  # fmt: skip
        assert err.count("\n") == 1
        code, out, err = _run(capsys, "logs", "never-ran")
        assert code == 2 and err.count("\n") == 1, err
        assert err.startswith(f"error: no run never-ran launched with state directory {shell}, and the Prefect API "
                              f"at {url} did not answer (ConnectError")  # fmt: skip


def test_a_silent_api_is_given_up_on_quickly(
    shell: Path, capsys: pytest.CaptureFixture[str], silent_api: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_ui_runs, "TIMEOUT_S", 0.5)
    with temporary_settings({PREFECT_API_URL: silent_api}):
        start = time.monotonic()
        code, _, err = _run(capsys, "status")
        took = time.monotonic() - start
    assert code == 0 and "did not answer (ReadTimeout" in err and err.count("\n") == 1, err
    assert took < 5, took  # one try of 0.5 s, not Prefect's 5 retries of 60 s
