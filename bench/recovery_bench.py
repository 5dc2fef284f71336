"""Recovery benchmark: what the orchestrator adds per preemption, and the goodput of a preempted run.

On the emulated clouds with fake provisioning latency 0 and the spec's default poll interval
(``TrainSpec.poll_interval``, 5 s) and heartbeat interval, it runs the reference trainer on a
v4-8 spot slice, preempts it 3 times (each time a few seconds after the previous recovery made its
first step), and prints a table: per preemption, the seconds from the preemption to the first new
step (the orchestrator's overhead: detect + delete + re-provision + restore), the split, and the
steps lost; then the run's goodput. The budget the issue sets: overhead ≤ poll interval + 5 s.

    .venv/bin/python bench/recovery_bench.py [--preemptions 3] [--steps 800] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("NO_GCE_CHECK", "true")
os.environ["TPU_OPS_DRY_RUN"] = "true"

ZONE = "us-central2-b"
RUN_ID = "recovery-bench"


def job(poll: float | None, steps: int, every: int) -> Any:
    from tpu_ops.specs import TrainJobSpec

    train: dict[str, Any] = {"checkpoint_dir": "gs://bench-ckpt/runs", "steps": steps, "checkpoint_every": every,
                             "hyperparameters": {"step_delay_s": 0.05}, "stall_limit": "5m"}  # fmt: skip
    if poll is not None:
        train["poll_interval"] = poll
    return TrainJobSpec.model_validate({
        "provision": {"slice": {"accelerator_type": "v4-8", "region": "us-central2", "zones": [ZONE]},
                      "ladder": ["spot", "on-demand"], "budget_usd": 1000, "hours": 1, "queue_timeout": "30s",
                      "overall_timeout": "5m"},
        "train": train,
    })  # fmt: skip


def first_new_step_at(gcs: Any, incarnation: str) -> float | None:
    from tpu_ops.train.layout import RunLayout, list_json

    layout = RunLayout(f"gs://bench-ckpt/runs/{RUN_ID}")
    beats = [b for b in list_json(gcs, layout.heartbeats) if b.get("incarnation") == incarnation]
    seen = [float(b["first_step_at"]) for b in beats if b.get("first_step_at")]
    return min(seen) if seen else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preemptions", type=int, default=3)
    parser.add_argument("--steps", type=int, default=800)  # long enough for 3 preemptions
    parser.add_argument("--every", type=int, default=20)
    parser.add_argument("--poll", type=float, default=None, help="poll interval (default: the spec's default)")
    parser.add_argument("--seed", type=int, default=0, help="seeds where in the poll cycle each preemption lands")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    from infra.local.stack import LocalStack
    from tpu_ops.cloud.clients import storage_client
    from tpu_ops.cloud.tpu import TpuApi
    from tpu_ops.train.supervisor import Supervisor
    from tpu_ops.train.wheel import agent_wheel

    spec = job(args.poll, args.steps, args.every)
    poll = spec.train.poll_interval.total_seconds()
    with tempfile.TemporaryDirectory() as tmp, LocalStack(provision_s=0.0, delete_s=0.0, grace_s=2.0) as stack:
        settings = stack.settings(state_dir=Path(tmp) / "state", poll_interval_s=0.1)
        gcs = storage_client(settings)
        gcs.create_bucket("bench-ckpt")
        sup = Supervisor(spec, RUN_ID, settings, wheel=agent_wheel(settings))
        preempted_at: list[float] = []
        errors: list[BaseException] = []

        rng = random.Random(args.seed)

        def inject() -> None:
            api = TpuApi(settings)
            try:
                for _ in range(args.preemptions):
                    # wait for the current incarnation's first new step, then let it train 3 s plus a random
                    # fraction of a poll interval, so the preemption lands anywhere in the supervisor's poll cycle
                    while not sup.report.incarnations or sup.report.incarnations[-1].first_step_at is None:
                        time.sleep(0.05)
                    time.sleep(3.0 + rng.uniform(0.0, poll))
                    node = next(n for n in api.list_nodes(ZONE) if n.node_id.startswith(RUN_ID) and n.state == "READY")
                    preempted_at.append(time.time())
                    stack.preempt(ZONE, node.node_id)
                    n = len(sup.report.incarnations)
                    while len(sup.report.incarnations) == n:
                        time.sleep(0.05)
            except BaseException as exc:  # reported below
                errors.append(exc)

        t = threading.Thread(target=inject, daemon=True)
        t.start()
        report = sup.run()
        t.join(5)
        if errors:
            raise errors[0]
        rows = []
        for p, at, inc in zip(report.preemptions, preempted_at, report.incarnations[1:], strict=False):
            first = first_new_step_at(gcs, inc.id) or (inc.first_step_at or at)
            rows.append({"#": p.number, "overhead_s": round(first - at, 2), "detect_s": round(p.detected_at - at, 2),
                         "delete_s": round(p.delete_s, 2), "reprovision_s": round(p.reprovision_s, 2),
                         "restore_s": round(p.restore_s or 0, 2), "steps_lost": p.steps_lost,
                         "resumed_from": p.resume_step})  # fmt: skip
    out = {
        "poll_interval_s": poll,
        "heartbeat_interval_s": spec.train.heartbeat_interval.total_seconds(),
        "budget_s": poll + 5.0,
        "preemptions": rows,
        "overhead_median_s": statistics.median(r["overhead_s"] for r in rows) if rows else None,
        "overhead_max_s": max((r["overhead_s"] for r in rows), default=None),
        "goodput": round(report.goodput, 4),
        "wall_s": round(report.wall_s, 1),
        "productive_s": round(report.productive_s, 1),
        "final_step": report.final_step,
        "steps_kept": report.steps_kept,
        "badput_s": {k: round(v, 2) for k, v in report.categories.items() if k != "productive"},
        "scheduling_goodput": report.scheduling_goodput,
        "cost_usd_by_tier": report.cost.get("usd_by_tier"),
    }
    report.check()  # goodput ≤ 100%, productive + badput = wall within 1% (raises otherwise)
    sound = report.steps_kept == report.final_step and report.goodput <= 1.0
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print(f"recovery bench: v4-8 spot, reference trainer, {args.steps} steps, checkpoint every {args.every}, "
          f"poll {poll:g} s, heartbeat {out['heartbeat_interval_s']:g} s, provisioning latency 0")  # fmt: skip
    header = ["#", "overhead_s", "detect_s", "delete_s", "reprovision_s", "restore_s", "steps_lost", "resumed_from"]
    print(" | ".join(f"{h:>13}" for h in header))
    for r in rows:
        print(" | ".join(f"{r[h]!s:>13}" for h in header))
    ok = out["overhead_max_s"] is not None and out["overhead_max_s"] <= out["budget_s"]
    print(
        f"overhead per preemption (preempt → first new step): median {out['overhead_median_s']} s, "
        f"max {out['overhead_max_s']} s; budget poll + 5 s = {out['budget_s']:g} s: {'OK' if ok else 'OVER'}"
    )
    print(f"goodput with {len(rows)} preemptions: {out['goodput']:.1%} ({out['productive_s']} s productive of "
          f"{out['wall_s']} s wall), final step {out['final_step']}, steps kept {out['steps_kept']}; "
          f"cost {out['cost_usd_by_tier']}")  # fmt: skip
    print(
        f"badput (s): {out['badput_s']}; invariants (goodput ≤ 100%, categories = wall, kept = final): "
        f"{'OK' if sound else 'BROKEN'}"
    )
    return 0 if ok and sound else 1


if __name__ == "__main__":
    sys.exit(main())
