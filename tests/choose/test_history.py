"""Capacity history folded from run records (tpu_ops/provision/history.py), exact figures; and the
same records read back from a checkpoint bucket on fake-gcs-server by ``tpu-ops capacity``."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tpu_ops.provision.choose import History
from tpu_ops.provision.history import fold, fold_run, stats

# A run in run state's form (state.json): a spot slice in zone a preempted after 2 h, replaced by
# a spot slice in zone b that finished after 1 h.
STATE = {
    "run_id": "r1",
    "started_at": 1000.0,
    "finished_at": 12000.0,
    "incarnations": [
        {
            "number": 0,
            "zone": "us-east5-a",
            "tier": "spot",
            "requested_at": 1000.0,
            "ready_at": 1300.0,
            "ended_at": 1300.0 + 7200,
            "queued_resource": "r1-a1",
        },
        {
            "number": 1,
            "zone": "us-east5-b",
            "tier": "spot",
            "requested_at": 8600.0,
            "ready_at": 8720.0,
            "ended_at": 8720.0 + 3600,
            "queued_resource": "r1-a2",
        },
    ],
    "preemptions": [
        {
            "number": 1,
            "incarnation": 0,
            "zone": "us-east5-a",
            "tier": "spot",
            "queued_resource": "r1-a1",
            "detected_at": 8500.0,
            "detect_s": 10.0,
            "delete_s": 20.0,
            "reprovision_s": 120.0,
            "restore_s": 30.0,
            "steps_lost": 40,
        },
    ],
    # Before zone b's slice: on-demand in zone a was refused for capacity, and zone b's spot twice.
    "stockouts": [
        {"zone": "us-east5-a", "tier": "on-demand", "at": 8610.0},
        {"zone": "us-east5-b", "tier": "spot", "at": 8640.0},
        {"zone": "us-east5-b", "tier": "spot", "at": 8680.0},
    ],
}
IDENT = {"accelerator_type": "v5p-32", "backend": "compute", "chips": 16}
A = ("v5p-32", "us-east5-a", "spot", "compute")
B = ("v5p-32", "us-east5-b", "spot", "compute")

# The same story as an older goodput report (goodput.json on main: no requested_at/ended_at).
REPORT = {
    "run_id": "r2",
    "started_at": 1000.0,
    "wall_s": 11000.0,
    "incarnations": [
        {"number": 0, "zone": "us-east5-a", "tier": "spot", "ready_at": 1300.0, "queued_resource": "r2-a1"},
        {"number": 1, "zone": "us-east5-b", "tier": "spot", "ready_at": 8720.0, "queued_resource": "r2-a2"},
    ],
    "preemptions": [
        {
            "number": 1,
            "zone": "us-east5-a",
            "tier": "spot",
            "queued_resource": "r2-a1",
            "detected_at": 8500.0,
            "detect_s": 10.0,
            "delete_s": 20.0,
            "reprovision_s": 120.0,
            "restore_s": None,
            "steps_lost": 40,
        },
    ],
}


def test_fold_run_state() -> None:
    got = fold_run(STATE, IDENT)
    assert got[A] == History(
        hours=2.0,
        preemptions=1,
        obtained=1,
        obtain_s_total=300.0,
        recoveries=1,
        recovery_s_total=60.0,
        steps_lost_total=40,
    )
    assert got[B] == History(hours=1.0, obtained=1, obtain_s_total=120.0, stockouts=2)


def test_fold_an_older_goodput_report() -> None:
    got = fold_run(REPORT)
    a, b = ("?", *A[1:3], "tpu-api"), ("?", *B[1:3], "tpu-api")  # no identity: unknown type, the TPU API
    # held until the preemption was detected (8500 - 1300 s = 2 h); the restore was never measured
    assert got[a] == History(hours=2.0, preemptions=1, steps_lost_total=40)
    # the last slice is held to the run's end (1000 + 11000 - 8720 s), obtained in the report's 120 s
    assert got[b] == History(hours=(12000 - 8720) / 3600, obtained=1, obtain_s_total=120.0)


def test_a_live_incarnation_is_held_until_now() -> None:
    live = {"incarnations": [{"zone": "z-a", "tier": "spot", "ready_at": 100.0, "requested_at": 40.0}]}
    got = fold_run(live, IDENT, now=100.0 + 1800)
    assert got[("v5p-32", "z-a", "spot", "compute")] == History(hours=0.5, obtained=1, obtain_s_total=60.0)
    # an incarnation that never became ready holds nothing
    assert fold_run({"incarnations": [{"zone": "z-a", "tier": "spot", "requested_at": 1.0}]}, IDENT) == {}


def test_fold_sums_runs_and_stats_report_means() -> None:
    got = fold([(STATE, IDENT), (STATE, IDENT)])
    assert got[A] == History(4.0, 2, 2, 600.0, 2, 120.0, 80)
    assert got[B].stockouts == 4 and got[B].obtained == 2
    assert got[("v5p-32", "us-east5-a", "on-demand", "compute")] == History(stockouts=2)
    rows = {(s.zone): s.to_json() for s in stats(got)}
    assert rows["us-east5-a"] == {
        "accelerator_type": "v5p-32",
        "zone": "us-east5-a",
        "tier": "spot",
        "backend": "compute",
        "hours": 4.0,
        "preemptions": 2,
        "preemptions_per_hour": 0.5,
        "slices_obtained": 2,
        "obtain_s_mean": 300.0,
        "recovery_s_mean": 60.0,
        "steps_lost_mean": 40.0,
        "stockouts": 0,
        "refused_share": 0.0,
    }
    assert rows["us-east5-b"]["preemptions_per_hour"] == 0.0
    assert (rows["us-east5-b"]["stockouts"], rows["us-east5-b"]["refused_share"]) == (4, round(4 / 6, 6))
    assert rows["us-east5-b"]["recovery_s_mean"] is None and rows["us-east5-b"]["steps_lost_mean"] is None


# -- from a bucket -------------------------------------------------------------------------------


def _client(env: dict[str, str]) -> Any:
    from tpu_ops.cloud.clients import storage_client
    from tpu_ops.settings import Settings

    return storage_client(Settings(dry_run=True, gcs_endpoint=env["TPU_OPS_GCS_ENDPOINT"]))


def test_capacity_stats_and_plan_from_a_bucket(
    gcs_env: dict[str, str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Any
) -> None:
    from flows.cli import main
    from tpu_ops.provision.history import write_identity
    from tpu_ops.provision.ranking import backend_of
    from tpu_ops.specs import ProvisionSpec, load_spec
    from tpu_ops.uris import parse_gs

    for k, v in gcs_env.items():
        monkeypatch.setenv(k, v)
    spec = tmp_path / "p.yaml"
    spec.write_text(
        "slice: {accelerator_type: v5p-32, region: us-east5, zones: [us-east5-a, us-east5-b]}\n"
        "ladder: [spot, on-demand]\nbudget_usd: 10000\nhours: 4\n"
        "choose: {history: 'gs://hist/ckpt', steps: 4000, checkpoint_every: 2000}\n"
    )
    backend = backend_of(load_spec(spec, ProvisionSpec))  # the Compute Engine for v5p, once it exists
    gcs = _client(gcs_env)
    gcs.create_bucket("hist")
    b = gcs.bucket("hist")
    b.blob("ckpt/r1/_tpu_ops/state.json").upload_from_string(json.dumps(STATE))
    write_identity(gcs, parse_gs("gs://hist/ckpt/r1"), "v5p-32", backend, 16)
    b.blob("ckpt/r2/_tpu_ops/goodput.json").upload_from_string(json.dumps(REPORT))
    b.blob("ckpt/r2/_tpu_ops/capacity.json").upload_from_string(json.dumps({**IDENT, "backend": backend}))
    b.blob("ckpt/r3/10/commit_success.txt").upload_from_string("")  # a run without records: skipped
    b.blob("ckpt/r3/_tpu_ops/goodput.json").upload_from_string("{not json")  # half-written: skipped

    assert main(["capacity", "stats", "--history", "gs://hist/ckpt", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["runs"] == 2
    a = next(r for r in out["rungs"] if r["zone"] == "us-east5-a" and r["tier"] == "spot")
    assert (a["hours"], a["preemptions"], a["preemptions_per_hour"]) == (4.0, 2, 0.5)
    assert (a["slices_obtained"], a["obtain_s_mean"], a["steps_lost_mean"]) == (1, 300.0, 40.0)
    assert main(["capacity", "stats", "--history", "gs://hist/ckpt"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("2 run(s) under gs://hist/ckpt") and "us-east5-b" in text

    # The plan for a spot ladder over both zones: zone a is preempted 4x as often per hour seen, but
    # zone b refused 2 of the 4 requests the two runs made of it: with the prior's 2 granted
    # pseudo-requests, full = 2/6, and each hour there is charged a third of on-demand's premium over
    # spot, which outweighs it.
    assert main(["capacity", "plan", "--spec", str(spec), "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["method"] == "cost"
    order = [(r["zone"], r["tier"]) for r in plan["rungs"]]
    assert order[0] == ("us-east5-a", "spot") and order[1] == ("us-east5-b", "spot")
    a_spot, b_spot = plan["rungs"][0], plan["rungs"][1]
    assert (a_spot["full"], a_spot["scarcity_usd"], b_spot["full"]) == (0.0, 0.0, round(1 / 3, 6))
    assert b_spot["scarcity_usd"] == pytest.approx(b_spot["held_s"] / 3600 * 16 * (4.2 - 2.1) / 3, rel=1e-5)
    assert b_spot["usd"] < a_spot["usd"] < b_spot["usd"] + b_spot["scarcity_usd"]  # cheaper, but scarce
    assert b_spot["why"].endswith(f"(scarce: 33% of requests refused, +${b_spot['scarcity_usd']:.2f} included)")
    assert "scarce" not in a_spot["why"]
    assert plan["rungs"][0]["why"].startswith("cheapest per kept step")
    assert "a rung the fleet finds full also costs" in plan["note"]
    assert plan["steps_left"] == 4000 and plan["seconds_per_step"] == 3.6
    # no history under another prefix: the written order, and it says so
    assert main(["capacity", "plan", "--spec", str(spec), "--history", "gs://hist/none"]) == 0
    assert "keeping the written order" in capsys.readouterr().out


def test_a_training_job_fills_in_the_ranking_from_its_train_section() -> None:
    from datetime import timedelta

    from tpu_ops.provision.ranking import run_model
    from tpu_ops.specs.jobs import TrainJobSpec
    from tpu_ops.train.choice import for_job

    body: dict[str, Any] = {
        "provision": {"slice": {"accelerator_type": "v5p-8", "region": "us-east5", "zones": ["us-east5-a"]},
                      "ladder": "auto", "budget_usd": 1000, "hours": 2},
        "train": {"checkpoint_dir": "gs://ckpt/runs", "steps": 7200, "checkpoint_every": 300, "max_duration": "6h"},
    }  # fmt: skip
    job = for_job(TrainJobSpec.model_validate(body))
    c = job.provision.choose
    assert c is not None and c.auto
    assert (c.steps, c.checkpoint_every, c.history, c.max_duration) == (7200, 300, "gs://ckpt/runs", timedelta(hours=6))
    run = run_model(job.provision, steps_done=1200, started_at=1000.0, now=1000.0 + 3600)
    # 2 h over 7200 steps = 1 s a step; 6000 steps left; 6 h from the start, one gone: 5 h left
    assert (run.steps, run.seconds_per_step, run.checkpoint_every, run.deadline_s) == (6000, 1.0, 300, 5 * 3600.0)
    # a spec's own deadline and history win; a job without choose is left alone
    body["provision"]["choose"] = {"history": "gs://elsewhere/x", "finish_by": "2026-11-24T06:00:00Z"}
    job2 = for_job(TrainJobSpec.model_validate(body))
    assert job2.provision.choose is not None
    assert job2.provision.choose.history == "gs://elsewhere/x" and job2.provision.choose.max_duration is None
    body["provision"]["ladder"] = ["spot"]
    del body["provision"]["choose"]
    plain = TrainJobSpec.model_validate(body)
    assert for_job(plain) is plain


def _shifted(record: dict[str, Any], by: float) -> dict[str, Any]:
    """The same run ``by`` seconds later (every moment moved, every duration kept)."""
    moments = ("started_at", "finished_at", "requested_at", "ready_at", "ended_at", "detected_at")

    def move(d: dict[str, Any]) -> dict[str, Any]:
        return {k: v + by if k in moments and isinstance(v, float) else v for k, v in d.items()}

    return {**move(record), "incarnations": [move(i) for i in record["incarnations"]],
            "preemptions": [move(p) for p in record["preemptions"]]}  # fmt: skip


def test_history_weighed_by_age() -> None:
    from tpu_ops.provision.history import last_seen, weight

    # STATE's newest moment is its second slice's end (8720 + 3600); REPORT's is started + wall.
    assert last_seen(STATE) == 12320.0 and last_seen(REPORT) == 12000.0
    assert last_seen({"incarnations": [{"ready_at": 5.0}, {"ready_at": 9.0, "ended_at": 7.0}]}) == 9.0
    assert last_seen({"incarnations": []}) is None
    assert weight(STATE, 12320.0 + 3600, 3600.0) == 0.5
    assert weight(STATE, 12320.0 + 7200, 3600.0) == 0.25
    assert weight(STATE, 12320.0 + 7200, None) == 1.0  # no half-life: every run counts alike
    assert weight(STATE, 11000.0, 3600.0) == 1.0  # a clock behind the record: not weighed up
    assert weight({"incarnations": []}, 1e9, 3600.0) == 1.0  # no time to age it by
    h = History(hours=2.0, preemptions=3, obtained=4, obtain_s_total=5.0, recoveries=6, recovery_s_total=7.0,
                steps_lost_total=8)  # fmt: skip
    assert h.scaled(0.5) == History(1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0)
    # The same run twice, one a half-life older: 1 + 1/2 of each sum.
    older = _shifted(STATE, -3600.0)
    assert fold_run(older, IDENT) == fold_run(STATE, IDENT)
    aged = fold([(STATE, IDENT), (older, IDENT)], now=12320.0, half_life_s=3600.0)
    one = fold_run(STATE, IDENT)
    assert aged[A] == one[A].merged(one[A].scaled(0.5)) and aged[A].preemptions == 1.5
    assert fold([(STATE, IDENT), (older, IDENT)], now=12320.0)[A].preemptions == 2  # unweighted


def test_the_ranking_reads_history_weighed_by_its_half_life(gcs_env: dict[str, str]) -> None:
    from tpu_ops.cloud.clients import Clients
    from tpu_ops.provision.ranking import history_for
    from tpu_ops.settings import Settings
    from tpu_ops.specs import ProvisionSpec

    gcs = _client(gcs_env)
    gcs.create_bucket("aged")
    gcs.bucket("aged").blob("ckpt/r1/_tpu_ops/state.json").upload_from_string(json.dumps(STATE))
    body: dict[str, Any] = {
        "slice": {"accelerator_type": "v5p-32", "region": "us-east5", "zones": ["us-east5-a"]},
        "ladder": ["spot"], "budget_usd": 10000, "hours": 4, "choose": {"history": "gs://aged/ckpt", "half_life": "1h"},
    }  # fmt: skip
    spec = ProvisionSpec.model_validate(body)
    settings = Settings(dry_run=True, gcs_endpoint=gcs_env["TPU_OPS_GCS_ENDPOINT"])
    key = ("?", "us-east5-a", "spot", "tpu-api")  # no capacity.json: accelerator unknown, default backend
    got = history_for(spec, Clients(settings), now=12320.0 + 3600)
    assert got[key].hours == 1.0 and got[key].preemptions == 0.5  # a half-life old: half of 2 h, 1
    del body["choose"]["half_life"]
    assert history_for(ProvisionSpec.model_validate(body), Clients(settings), now=12320.0 + 3600)[key].preemptions == 1


def test_plan_of_a_training_spec_reads_its_own_checkpoint_dir(
    gcs_env: dict[str, str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Any
) -> None:
    """No `choose` and no --history: the history is where `capacity stats` finds it, the checkpoint dir."""
    from flows.cli import main
    from tpu_ops.provision.history import write_identity
    from tpu_ops.uris import parse_gs

    for k, v in gcs_env.items():
        monkeypatch.setenv(k, v)
    spec = tmp_path / "train.yaml"
    spec.write_text(
        "provision:\n"
        "  slice: {accelerator_type: v5p-32, region: us-east5, zones: [us-east5-a, us-east5-b]}\n"
        "  ladder: [spot, on-demand]\n  budget_usd: 10000\n  hours: 4\n"
        "train: {checkpoint_dir: 'gs://own-hist/ckpt', steps: 4000, checkpoint_every: 2000}\n"
    )
    gcs = _client(gcs_env)
    gcs.create_bucket("own-hist")
    gcs.bucket("own-hist").blob("ckpt/r1/_tpu_ops/state.json").upload_from_string(json.dumps(STATE))
    write_identity(gcs, parse_gs("gs://own-hist/ckpt/r1"), "v5p-32", "compute", 16)
    assert main(["capacity", "stats", "--history", "gs://own-hist/ckpt", "--json"]) == 0
    seen = {(r["zone"], r["tier"]): r["hours"] for r in json.loads(capsys.readouterr().out)["rungs"]}
    assert seen.get(("us-east5-a", "spot"), 0) > 0, seen
    assert main(["capacity", "plan", "--spec", str(spec), "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    used = {(r["zone"], r["tier"]): r["history_hours"] for r in plan["rungs"]}
    assert used[("us-east5-a", "spot")] == seen[("us-east5-a", "spot")], (used, plan["note"])
    assert "keeping the written order" not in plan["note"]
