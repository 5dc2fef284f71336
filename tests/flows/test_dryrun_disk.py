"""Issue 31, points 3-5: what a dry run leaves on disk, the commands it prints, goodput explained."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from flows.commands._disk import disk_bytes, remove_workers, tpu_ops_exe
from flows.commands.dryrun import inspect_commands
from flows.report import glance_rows, goodput_line, goodput_rows, left_behind

ROOT = Path(__file__).resolve().parents[2]
SYSTEM_PATH = {"PATH": "/usr/bin:/bin"}


def _du(path: Path) -> int:
    return int(subprocess.run(["du", "-sb", str(path)], capture_output=True, text=True, check=True).stdout.split()[0])


def test_remove_workers_frees_what_du_counts(tmp_path: Path) -> None:
    workers = tmp_path / "work" / "workers"
    venv = workers / "tpu-ops-local" / "us-east5-c" / "slice-a" / "worker-0" / "run" / "venv" / "lib"
    venv.mkdir(parents=True)
    (venv / "numpy.so").write_bytes(os.urandom(300_000))
    (venv.parent / "python3").symlink_to("/usr/bin/python3")  # a venv's link: not followed
    (tmp_path / "work" / "runs").mkdir()
    (tmp_path / "work" / "runs" / "audit-trail.jsonl").write_text("{}\n")
    assert disk_bytes(tmp_path / "work") == _du(tmp_path / "work")
    kept = disk_bytes(tmp_path / "work") - disk_bytes(workers)
    assert remove_workers(workers) >= 300_000
    assert not workers.exists() and (tmp_path / "work" / "runs" / "audit-trail.jsonl").is_file()
    assert disk_bytes(tmp_path / "work") == kept == _du(tmp_path / "work")
    assert remove_workers(workers) == 0  # nothing there: nothing to do


def test_make_clean_removes_the_dry_runs_files() -> None:
    plan = subprocess.run(["make", "-n", "clean"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert any(line.startswith("rm -rf") and ".tpu-ops/dry-run" in line.split() for line in plan.splitlines()), plan


def test_printed_commands_name_a_tpu_ops_the_system_path_finds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    assert tpu_ops_exe() == ".venv/bin/tpu-ops"
    commands = inspect_commands("run-1", {"audit_trail": "no such trail.jsonl"}, Path(".tpu-ops/dry-run/state"))
    assert commands[0] == ".venv/bin/tpu-ops audit verify 'no such trail.jsonl' --no-signatures"
    for command in commands:  # each finds its program with only the system PATH (127: command not found)
        done = subprocess.run(["bash", "-c", command], cwd=ROOT, env=SYSTEM_PATH, capture_output=True, text=True)
        assert done.returncode != 127 and "command not found" not in done.stderr, (command, done.stderr)
    cost = subprocess.run(["bash", "-c", commands[2]], cwd=ROOT, env=SYSTEM_PATH, capture_output=True, text=True)
    assert "no ledger found for run run-1" in cost.stderr  # tpu-ops itself answered


def test_outside_the_project_the_path_is_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert tpu_ops_exe() == str(ROOT / ".venv" / "bin" / "tpu-ops")


TRAINING = {
    "outcome": "done", "final_step": 60, "steps": 60, "wall_s": 13.9, "productive_s": 3.1, "goodput": 0.2230,
    "badput_s": {"program_startup": 7.3, "tpu_initialization": 1.9, "checkpoint_save": 0.9, "other": 0.66,
                 "data_loading": 0.04, "training_prep": 0.0},
}  # fmt: skip


def test_goodput_is_explained_on_one_line() -> None:
    assert goodput_line(TRAINING) == (
        "22.3% = productive 3.1 s of 13.9 s; start-up 7.3 s, TPU init 1.9 s, checkpoint save 0.9 s, other 0.7 s"
    )
    assert goodput_line({"goodput": 0.5}) == "50.0%"  # a summary without categories: the figure alone
    assert dict(glance_rows({"training": TRAINING}))["goodput"] == goodput_line(TRAINING)


def test_the_goodput_artifact_shows_the_badput_categories() -> None:
    rows = goodput_rows(TRAINING, [{"number": 1, "reason": "spot", "resume_step": 15, "steps_lost": 0}])
    assert [r["what"] for r in rows] == [
        "run", "badput: start-up", "badput: TPU init", "badput: checkpoint save", "badput: other", "preemption 1: spot",
    ]  # fmt: skip
    assert rows[1]["wall (s)"] == "7.3" and rows[1]["goodput"] == "52.5% of wall"
    assert len({tuple(r) for r in rows}) == 1  # every row has the table's columns


def test_left_behind_counts_the_bytes_on_disk() -> None:
    left = {"tpu_resources": 0, "worker_processes": 0}
    assert left_behind(left) == "nothing"
    disk = {"path": ".tpu-ops/dry-run", "bytes": 23 * 2**20 + 2**19, "workers_kept": False}
    assert left_behind(left, disk) == (
        "nothing in the clouds; 23.5 MiB on disk in .tpu-ops/dry-run (workers' files removed)"
    )
    assert "kept (--keep)" in left_behind(left, {**disk, "workers_kept": True})
