"""``tpu-ops train --spec FILE --run-id ID``: training that survives preemption, with a goodput report.

The spec (a ``provision`` and a ``train`` section), the run id and the budget are checked before
Prefect starts or any cloud call is made.
"""

from __future__ import annotations

import argparse
import json
from typing import Any


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "train",
        help="Train on a TPU slice through the capacity ladder; recover from preemptions; report goodput.",
        description="Runs the `train` Prefect flow: provisions through the ladder, runs the job on every "
        "worker (resuming from the newest complete checkpoint), recovers from preemption up to "
        "max_recoveries, always tears down, and prints the goodput report (also in "
        "<checkpoint_dir>/<run_id>/_tpu_ops/goodput.json). Re-running a finished run trains nothing.",
    )
    p.add_argument("--spec", required=True, metavar="FILE", help="a train job spec: {provision: ..., train: ...}")
    p.add_argument("--run-id", required=True, help="names every resource and checkpoint of the run")
    p.add_argument("--json", action="store_true", help="print the goodput report as JSON")
    p.add_argument("--no-flow", action="store_true", help="call the library directly (no Prefect API needed)")
    p.set_defaults(handler=run_train)


def format_report(doc: dict[str, Any]) -> str:
    """The goodput report as text: totals, then one line per preemption."""
    from tpu_ops.text import amounts_by, usd_by

    cost = doc["cost"]
    lines = [
        f"run {doc['run_id']}: {doc['outcome']} at step {doc['final_step']}/{doc['steps']}",
        f"  wall {doc['wall_s']:.1f} s, productive {doc['productive_s']:.1f} s, goodput {doc['goodput']:.1%}",
        f"  cost by tier: {usd_by(cost.get('usd_by_tier', {}))} (total ${float(cost.get('usd_total', 0)):,.4f}); "
        f"chip-hours by phase: {amounts_by(cost.get('chip_hours_by_phase', {}), 'chip-h')}",
    ]
    for p in doc["preemptions"]:
        lines.append(
            f"  preemption {p['number']} ({p['reason']}, {p['tier']} {p['zone']}): lost {p['steps_lost']} step(s), "
            f"resumed from {p['resume_step']}; detect {p['detect_s']:.1f} s, delete {p['delete_s']:.1f} s, "
            f"re-provision {p['reprovision_s']:.1f} s, restore {p['restore_s'] or 0:.1f} s"
        )
    return "\n".join(lines)


def run_train(args: argparse.Namespace) -> int:
    from flows.commands._specs import expect_kind
    from flows.settings import resolve_settings
    from tpu_ops.layout import check_run_id
    from tpu_ops.provision.cost import check_budget
    from tpu_ops.provision.prices import load
    from tpu_ops.specs import TrainJobSpec, load_spec

    expect_kind(args.spec, "train-job", "tpu-ops train --spec")
    spec = load_spec(args.spec, TrainJobSpec)
    run_id = check_run_id(args.run_id)
    settings = resolve_settings()
    check_budget(spec.provision, load(settings), "provision.budget_usd")  # refuse before Prefect or any cloud call
    from tpu_ops.train.incarnations import check_command

    check_command(spec, run_id)
    if args.no_flow:
        from tpu_ops.run import Run
        from tpu_ops.train.supervisor import supervise
        from tpu_ops.train.wheel import agent_wheel

        doc = supervise(spec, Run.of_job(run_id, settings, spec), wheel=agent_wheel(settings)).to_json()
    else:
        from prefect import tags

        from flows.provision import run_tag
        from flows.train import train

        with tags(run_tag(run_id)):
            result = train(spec, run_id)
        assert isinstance(result, dict)  # the budget, the flow's only refusal, was checked above
        doc = result
    print(json.dumps(doc, indent=2, default=str) if args.json else format_report(doc))
    return 0
