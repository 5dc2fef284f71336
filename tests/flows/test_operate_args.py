"""Bad input to ``launch``, ``status``, ``logs``, ``cancel`` and ``local preempt``: one line naming what is
wrong and what is allowed, exit 2, before any cloud call (nothing listens on any endpoint here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from flows.cli import main

EX = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(autouse=True)
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for var in ("PREFECT_API_URL", "TPU_OPS_GCS_ENDPOINT", "TPU_OPS_TPU_ENDPOINT", "TPU_OPS_COMPUTE_ENDPOINT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("TPU_OPS_STATE_DIR", str(tmp_path / "state"))
    return tmp_path / "state"


def _fails(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """Run the command line; it must exit 2 with one error line (argparse's usage line aside). That line."""
    try:
        code = main(list(argv))
    except SystemExit as exc:  # argparse refuses the value itself
        code = int(exc.code or 0)
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith(("usage:", " "))]
    assert code == 2 and len(lines) == 1, (code, err)
    return lines[0]


def _known_run(state_dir: Path) -> None:
    """A launch record of a 2-host train job (nothing runs: the commands must refuse before looking)."""
    from tpu_ops.settings import Settings
    from tpu_ops.train.launches import PROCESS, LaunchRecord, launch_dir, save

    settings = Settings(state_dir=state_dir)
    save(settings, LaunchRecord("walk-1", "train-job", PROCESS, checkpoint_dir="gs://walk-ckpt/runs",
                                zones=["us-central2-b"], hosts=2))  # fmt: skip
    (launch_dir(settings, "walk-1") / "spec.json").write_text("{}")


def test_launch_refuses_what_it_cannot_run(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    line = _fails(capsys, "launch", str(tmp_path / "nope.yaml"))
    assert "nope.yaml: cannot read" in line
    line = _fails(capsys, "launch", str(EX / "mirror.yaml"))
    assert "is a mirror spec; launch runs a pipeline, train job or provision spec" in line
    assert "tpu-ops mirror SRC DEST" in line
    odd = tmp_path / "odd.yaml"
    odd.write_text("colour: blue\n")
    assert "declare it on the first line, e.g. `# kind: train-job`" in _fails(capsys, "launch", str(odd))
    line = _fails(capsys, "launch", str(EX / "train.yaml"), "--run-id", "Bad_ID")
    assert "run id 'Bad_ID' is not allowed: 1-40 lowercase letters" in line


def test_provision_and_train_name_the_kind_of_a_spec_they_do_not_take(capsys: pytest.CaptureFixture[str]) -> None:
    line = _fails(capsys, "provision", "--spec", str(EX / "pipeline.yaml"), "--run-id", "run-1")
    assert line == (f"error: {EX / 'pipeline.yaml'} is a pipeline spec, not a provision spec (tpu-ops provision "
                    f"--spec takes one); run it with: tpu-ops launch {EX / 'pipeline.yaml'}")  # fmt: skip
    line = _fails(capsys, "train", "--spec", str(EX / "provision.yaml"), "--run-id", "run-1")
    assert "is a provision spec, not a train job spec" in line
    line = _fails(capsys, "local", "seed", "--spec", str(EX / "nightly-auto.yaml"))
    assert "is a train job spec, not a pipeline spec (tpu-ops local seed --spec takes one)" in line
    line = _fails(capsys, "doctor", "--spec", str(EX / "local-train.yaml"))  # was: name, mirror, export required
    assert f"{EX / 'local-train.yaml'} is a train job spec, not a pipeline spec (tpu-ops doctor --spec" in line


@pytest.mark.parametrize(
    "argv", [["status", "never-ran"], ["logs", "never-ran"], ["cancel", "never-ran"], ["local", "preempt", "never-ran"]]
)
def test_an_unknown_run_is_named_with_where_it_was_looked_for(
    capsys: pytest.CaptureFixture[str], state_dir: Path, argv: list[str]
) -> None:
    line = _fails(capsys, *argv)
    assert f"no run never-ran launched with state directory {state_dir}" in line and "tpu-ops status" in line


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["logs", "walk-1", "--worker", "x"], "'x' is not allowed: a worker number, 0 or more"),
        (["logs", "walk-1", "--worker", "2"], "--worker 2 is not allowed: run walk-1 has workers 0-1"),
        (["logs", "walk-1", "--slice", "s1"], "'s1' is not allowed: a slice number, 0 or more"),
        (["logs", "walk-1", "--slice", "1"], "--slice 1 is not allowed: run walk-1 has one slice, slice 0"),
        (["cancel", "walk-1", "--wait", "-5"], "'-5' is not allowed: seconds from 0 to 3600"),
        (["local", "preempt", "walk-1", "--slice", "one"], "'one' is not allowed: a slice number, 0 or more"),
        (["status", "Bad_ID"], "run id 'Bad_ID' is not allowed"),
    ],
)
def test_bad_values_say_what_is_allowed(
    capsys: pytest.CaptureFixture[str], state_dir: Path, argv: list[str], says: str
) -> None:
    _known_run(state_dir)
    assert says in _fails(capsys, *argv)


def test_status_without_runs_says_so(capsys: pytest.CaptureFixture[str], state_dir: Path) -> None:
    assert main(["status"]) == 0
    assert capsys.readouterr().out.startswith(f"no runs launched with state directory {state_dir}")


def test_local_preempt_refuses_a_real_cloud(
    capsys: pytest.CaptureFixture[str], state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _known_run(state_dir)
    monkeypatch.setenv("TPU_OPS_DRY_RUN", "false")
    try:
        code = main(["local", "preempt", "walk-1"])
    finally:
        monkeypatch.setenv("TPU_OPS_DRY_RUN", "true")
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1 and "for the local stack only" in err[0] and "fix:" in err[0]


def test_launch_prints_follow_ups_the_readmes_shell_runs_without_the_venv_activated(
    state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The README's third shell has no venv on its PATH: a bare `tpu-ops status RUN` there is 'command not found'."""
    from flows.commands.launch import describe
    from tpu_ops.settings import Settings
    from tpu_ops.train.launches import PROCESS, LaunchRecord

    monkeypatch.chdir(EX.parent)
    record = LaunchRecord("walk-1", "train-job", PROCESS, checkpoint_dir="gs://walk-ckpt/runs", zones=["us-central2-b"],
                          hosts=2, pid=1)  # fmt: skip
    text = describe(record, Settings(state_dir=state_dir))
    for follow_up in ("status walk-1", "logs walk-1 --follow", "cancel walk-1"):
        assert f"  .venv/bin/tpu-ops {follow_up}" in text, text
