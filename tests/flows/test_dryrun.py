"""The main job: `tpu-ops dry-run` runs the whole pipeline against emulated clouds and leaves nothing."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
from dryruns import EXE, dry_run


@pytest.mark.slow
def test_dry_run_on_compute_engine_by_default(default_dry_run: dict[str, Any]) -> None:
    tmp_path, summary, out, env = (default_dry_run[k] for k in ("tmp", "summary", "out", "env"))
    assert summary["disk"]["workers_kept"] and (tmp_path / "work" / "workers").is_dir()
    assert summary["backend"] == "compute"
    # reservation too small (2 of 4 hosts), spot stocked out in b, a (spot: not BULK) group of 4 in c; again
    # after the injected preemption, which deleted the whole group and made a new one
    assert (summary["slice"]["tier"], summary["slice"]["zone"], summary["slice"]["hosts"]) == ("spot", "us-east5-c", 4)
    assert [a.split(" in ")[0] for a in summary["attempts"]] == [
        "#1 reservation fraud-v5p-reservation",
        "#2 spot",
        "#3 spot",
    ] * 2
    assert summary["injected_preemption"].startswith("host ") and summary["training"]["recoveries"] == 1
    (p,) = summary["preemptions"]
    assert "preempt" in p["reason"] and p["resume_step"] is not None and 0 <= p["steps_lost"] <= 10
    assert summary["training"]["outcome"] == "done" and summary["training"]["final_step"] == 60
    assert summary["final_params"]["bit_identical"], summary["final_params"]  # as if never interrupted
    assert summary["workers_verified"] == 4
    assert summary["left_behind"] == {"tpu_resources": 0, "worker_processes": 0}
    assert summary["cost"]["open_slices"] == 0 and summary["cost"]["usd_total"] > 0
    assert summary["audit"]["ok"]
    reports = sorted((tmp_path / "work" / "workers").rglob("stdout.log"))
    assert len(reports) == 8  # 4 hosts, twice
    assert sum("resuming from step" in r.read_text() for r in reports) == 4
    # one host preempted: every host of the slice got the notice, so the step in hand was saved
    first = [r.read_text() for r in reports if "resuming from step" not in r.read_text()]
    assert len(first) == 4 and all("SIGTERM: notice written" in text for text in first)
    assert p["steps_lost"] == 0 and p["resume_step"] == p["last_step"]
    assert "Traceback" not in out.stderr
    # its own Prefect home, under the workdir: not the PREFECT_HOME (or ~/.prefect) of the shell
    assert (tmp_path / "work" / "prefect-home").is_dir() and not (tmp_path / "prefect").exists()
    _inspect_with_the_stack_down(tmp_path, env, summary)
    # A second dry run in a row (same Prefect home: its concurrency limit exists now) prints the table,
    # the lineage and the commands, and no traceback; without --keep it removes its workers' files, and
    # the workdir grows by less than 20 MB (issue 31: it was 613 MB a run).
    from flows.commands._disk import disk_bytes

    work = tmp_path / "work"
    staying = disk_bytes(work) - disk_bytes(work / "workers")  # what the first run leaves once cleaned
    again = subprocess.run([str(EXE), "dry-run", "--workdir", str(work)],
                           capture_output=True, text=True, cwd=tmp_path, env=env, timeout=240)  # fmt: skip
    assert again.returncode == 0, again.stderr[-3000:]
    assert "Traceback" not in again.stdout + again.stderr, again.stderr[-3000:]
    assert not (work / "workers").exists()
    grew = disk_bytes(work) - staying
    assert grew < 20 * 2**20, f"the workdir grew by {grew} bytes in one dry run"
    left = next(line for line in again.stdout.splitlines() if line.startswith("| left behind "))
    assert f"| nothing in the clouds; {disk_bytes(work) / 2**20:.1f} MiB on disk in {work}" in left, left
    assert "  → training run" in again.stdout and "audit chain" in again.stdout  # the lineage, as text
    _printed_commands_run_without_the_venv(again.stdout, tmp_path)


def _printed_commands_run_without_the_venv(stdout: str, cwd: Path) -> None:
    """The commands the dry run prints work as printed in a shell with only the system PATH."""
    printed = stdout[stdout.index("these read them:") :].splitlines()[1:]
    commands = [line.strip() for line in printed if line.startswith("  ")]
    assert len(commands) == 3 and all("tpu-ops" in c for c in commands), printed
    for command in commands:
        done = subprocess.run(["bash", "-c", command], cwd=cwd, env={"PATH": "/usr/bin:/bin", "HOME": str(cwd)},
                              capture_output=True, text=True, timeout=120)  # fmt: skip
        assert done.returncode == 0, (command, done.stderr[-2000:])


@pytest.mark.slow
def test_dry_run_end_to_end(tmp_path: Path) -> None:
    summary, _, _ = dry_run(tmp_path, "--backend", "tpu-api", "--keep")
    assert summary["backend"] == "tpu-api"
    # the ladder had to work: reservation too small, spot stocked out in b, spot in c wins; and again
    # after the injected preemption
    assert summary["slice"]["tier"] == "spot" and summary["slice"]["zone"] == "us-central2-c"
    assert [a.split(" in ")[0] for a in summary["attempts"]] == [
        "#1 reservation fraud-v4-reservation",
        "#2 spot",
        "#3 spot",
    ] * 2
    assert summary["slice"]["hosts"] == 4 and summary["workers_verified"] == 4
    # trained with the reference trainer through one spot preemption, resuming from a committed step
    assert summary["injected_preemption"] and summary["training"]["recoveries"] == 1
    assert summary["training"]["outcome"] == "done" and summary["training"]["final_step"] == 60
    assert summary["final_params"]["bit_identical"], summary["final_params"]  # as if never interrupted
    (p,) = summary["preemptions"]
    # the workers' SIGTERM notice lets them agree on and save the step in hand (so not only multiples of 10)
    assert p["resume_step"] is not None and p["resume_step"] >= 10 and 0 <= p["steps_lost"] <= 10
    assert summary["objects_copied"] == 17  # 16 shards + the schema file
    assert summary["snapshot_id"].startswith("ds-")
    assert summary["left_behind"] == {"tpu_resources": 0, "worker_processes": 0}
    assert summary["cost"]["open_slices"] == 0 and summary["cost"]["usd_total"] > 0
    # the table a person reads at the end: every row filled from this run
    from flows.report import glance_rows

    glance = dict(glance_rows(summary))
    assert glance["winning rung"].startswith("spot in us-central2-c")
    assert glance["preemptions / recoveries"] == "1 / 1"
    left = glance["left behind"]
    assert left.startswith("nothing in the clouds; ") and "workers' files kept" in left, left
    # goodput explained: productive of wall, then where the rest went, largest first
    assert glance["goodput"].startswith(f"{summary['training']['goodput']:.1%} = productive ")
    assert "start-up " in glance["goodput"] and "TPU init " in glance["goodput"]
    # the reference trainer reports tokens and model FLOPs per step: $/M tokens and MFU beside goodput
    eff = summary["training"]["efficiency"]
    assert eff["steps_kept"] == 60 and eff["tokens"] > 0 and eff["usd_per_million_tokens"] > 0 and eff["mfu"] > 0
    assert glance["$/M tokens, MFU"].startswith("$") and "MFU" in glance["$/M tokens, MFU"]
    assert glance["model package"].startswith("arn:aws:sagemaker:") and "model-package/" in glance["model package"]
    assert summary["audit"]["ok"] and glance["audit verify"].startswith("OK") and summary["audit"]["records"] > 0
    assert [r["outcome"] for r in summary["ladder"][:3]] == ["stockout", "stockout", "active"]
    reports = sorted((tmp_path / "work" / "workers").rglob("stdout.log"))
    assert len(reports) == 8  # 4 workers, twice
    assert all("verified snapshot " + summary["snapshot_id"] in r.read_text() for r in reports)
    assert sum("resuming from step" in r.read_text() for r in reports) == 4


def _inspect_with_the_stack_down(tmp_path: Path, env: dict[str, str], summary: dict[str, object]) -> None:
    """The commands the dry run prints read its files; no emulated cloud is running any more."""
    run_id = str(summary["run_id"])
    files = summary["files"]
    assert isinstance(files, dict)
    kept = tmp_path / "work" / "runs" / run_id
    assert Path(files["audit_trail"]) == kept / "audit-trail.jsonl" and (kept / "goodput.json").is_file()

    def tpu_ops(*argv: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(EXE), *argv], capture_output=True, text=True, cwd=tmp_path,
                              env={**env, **extra}, timeout=60)  # fmt: skip

    verify = tpu_ops("audit", "verify", files["audit_trail"], "--no-signatures")
    assert verify.returncode == 0 and verify.stdout.startswith("intact: "), verify.stderr
    lineage = tpu_ops("audit", "lineage", run_id, "--trail", files["audit_trail"])
    assert lineage.returncode == 0, lineage.stderr
    assert f"→ training run  {run_id}" in lineage.stdout and "preemptions: 1" in lineage.stdout
    assert "sealed by digest" in lineage.stdout and "{" not in lineage.stdout  # no Python reprs
    cost = tpu_ops("cost", "--run", run_id, TPU_OPS_STATE_DIR=str(tmp_path / "work" / "state"))
    assert cost.returncode == 0 and f"run {run_id}: $" in cost.stdout and "spot" in cost.stdout, cost.stderr
    unknown = tpu_ops("cost", "--run", "never-ran", TPU_OPS_STATE_DIR=str(tmp_path / "work" / "state"))
    assert unknown.returncode == 1 and "no ledger found" in unknown.stderr


def test_dry_run_refuses_a_bad_spec_before_starting_anything(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: Bad Name\n")
    out = subprocess.run([str(EXE), "dry-run", "--spec", str(bad)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "name: " in out.stderr and "mirror: Field required" in out.stderr
    assert "starting the local stack" not in out.stdout


@pytest.mark.slow
def test_dry_run_of_the_multislice_example(tmp_path: Path) -> None:
    """2 slices of 2 hosts, one of them preempted: the healthy one kept, the lost one replaced, no step lost."""
    spec = Path(__file__).resolve().parents[2] / "examples" / "multislice.yaml"
    summary, _, _ = dry_run(tmp_path, "--spec", str(spec), "--keep")  # the workers' logs are read below
    run_id = summary["run_id"]
    assert summary["slice"]["slices"] == 2 and summary["slice"]["hosts"] == 4 and summary["workers_verified"] == 4
    assert summary["training"]["outcome"] == "done" and summary["training"]["final_step"] == 60
    assert summary["final_params"]["bit_identical"], summary["final_params"]  # as if never interrupted
    (p,) = summary["preemptions"]  # one preemption, of one slice
    lost = p["queued_resource"]
    # On the TPU API the 2 slices are one multislice queued resource {run}-a1 with nodes -a1-0 and -a1-1
    assert lost in (f"{run_id}-a1-0", f"{run_id}-a1-1") and p["steps_lost"] == 0
    kept = ({f"{run_id}-a1-0", f"{run_id}-a1-1"} - {lost}).pop()
    # one request the whole run: granted, then adopted again once Google had repaired the lost slice
    assert [(r["resource_id"], r["outcome"]) for r in summary["ladder"]] == [
        (f"{run_id}-a1", "active"),
        (f"{run_id}-a1", "adopted"),
    ]
    billed = [s["resource_id"] for s in summary["cost"]["slices"]]
    assert billed.count(kept) == 1 and billed.count(lost) == 2  # the healthy slice kept, the lost one replaced
    assert summary["left_behind"] == {"tpu_resources": 0, "worker_processes": 0}
    reports = sorted((tmp_path / "work" / "workers").rglob("stdout.log"))
    # 2 x 2 workers; the repaired node's 2; the healthy node's 2 again (Google restarts its VMs after a repair)
    assert len(reports) == 8
    assert sum("another slice was lost: stopping at the step in hand" in r.read_text() for r in reports) == 2


@pytest.mark.slow
def test_dry_run_of_the_elastic_example(tmp_path: Path) -> None:
    """v5p-32 preempted and stocked out everywhere → v5p-16 accumulating 2 → v5p-32 again, bit-identical."""
    spec = Path(__file__).resolve().parents[2] / "examples" / "elastic.yaml"
    summary, _, _ = dry_run(tmp_path, "--spec", str(spec), "--keep")  # the workers' logs are read below
    assert summary["training"]["outcome"] == "done" and summary["training"]["final_step"] == 60
    assert summary["training"]["recoveries"] == 2 and summary["left_behind"] == {
        "tpu_resources": 0,
        "worker_processes": 0,
    }
    injected = summary["elastic"]["injected"]
    assert [e["event"] for e in injected] == ["target stocked out", "target back in stock"]
    assert "(v5p-32)" in injected[0]["preempted"] and "(v5p-16)" in injected[1]["preempted"]
    # every shape used and its steps: the target twice (before and after), the v5p-16 between
    shapes = {s["shape"]: s for s in summary["shapes"]}
    assert list(shapes) == ["v5p-32", "v5p-16"] and shapes["v5p-32"]["incarnations"] == 2
    assert shapes["v5p-16"]["incarnations"] == 1 and shapes["v5p-16"]["steps"] > 0
    assert shapes["v5p-32"]["steps"] + shapes["v5p-16"]["steps"] == 60
    assert (shapes["v5p-32"]["chips"], shapes["v5p-16"]["chips"]) == (16, 8)
    # the ledger says why: the target first each time, the v5p-16 only when no v5p-32 could be had
    ledger = [(r["kind"], r["shape"]) for r in summary["elastic"]["ledger"]]
    assert ledger == [("shape", "v5p-32"), ("shape-unavailable", "v5p-32"), ("shape", "v5p-16"), ("shape", "v5p-32")]
    assert summary["elastic"]["ledger"][2]["accum_steps"] == 2
    # the same as an uninterrupted v5p-32 run (the reference trainer, one micro-batch per target chip), to the bit
    assert summary["final_params"]["bit_identical"] and summary["final_params"]["max_rel_diff"] == 0.0, summary
    logs = [p.read_text() for p in (tmp_path / "work" / "workers").rglob("trainer.log")]
    assert len(logs) == 10  # 4 hosts, 2, then 4 again (the hosts of a partial group never start a trainer)
    assert sum("shape v5p-16 (target v5p-32), 2 micro-batch(es) per chip" in t for t in logs) == 2
    assert sum("shape v5p-32 (target v5p-32), 1 micro-batch(es) per chip" in t for t in logs) == 8
