"""``tpu-ops provision``: a slice through the capacity ladder.

Input is validated (spec file, run id, budget) before any cloud call; heavy imports stay in the
handler so ``--help`` is instant.
"""

from __future__ import annotations

import argparse

from flows.commands._common import shell_settings, show


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "provision",
        help="Get a TPU slice through the capacity ladder (its rungs in order: reservation, calendar, spot, "
        "flex-start, on-demand; zone by zone).",
        description="Runs the provision-slice Prefect flow: budget check first, then the ladder's rungs in "
        "order (reservation, calendar, spot, flex-start, on-demand: as the spec lists them), one slice request "
        "per attempt: a Compute Engine instance or instance group (the default for v5p, v6e and TPU7x; flex-start "
        "and calendar reservations only there), or a Cloud TPU API queued resource (v4, v5e, or "
        "slice.backend: tpu-api). "
        "Re-running with the same --run-id adopts the existing slice. The slice stays up until "
        "`tpu-ops teardown RUN_ID`.",
    )
    p.add_argument("--spec", required=True, metavar="FILE", help="a provision spec (YAML or JSON)")
    p.add_argument("--run-id", required=True, help="names every resource of the run (≤ 40 chars, [a-z0-9-])")
    p.add_argument("--json", action="store_true", help="print the slice as JSON")
    p.add_argument("--no-flow", action="store_true", help="call the library directly (no Prefect API needed)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from flows.commands._specs import expect_kind
    from tpu_ops.layout import check_run_id
    from tpu_ops.provision.cost import check_budget
    from tpu_ops.provision.prices import load
    from tpu_ops.specs import ProvisionSpec, load_spec

    expect_kind(args.spec, "provision", "tpu-ops provision --spec")
    spec = load_spec(args.spec, ProvisionSpec)
    run_id = check_run_id(args.run_id)
    settings = shell_settings()
    check_budget(spec, load(settings))  # refuse before starting Prefect or calling the cloud
    if args.no_flow:
        from tpu_ops.provision import provision
        from tpu_ops.provision.ledger import Ledger

        result = provision(spec, run_id, settings).to_json()
        Ledger(settings, run_id).hand_off(result["queued_resource"])
    else:
        from prefect import tags

        from flows.provision import provision_slice, run_tag

        with tags(run_tag(run_id)):
            got = provision_slice(spec, run_id)
        assert isinstance(got, dict)  # the budget, the flow's only refusal, was checked above
        result = got
    what = (
        f"queued resource {result['queued_resource']}, node {result['node']}"
        if result.get("backend", "tpu-api") == "tpu-api"
        else f"Compute Engine {'group' if result['hosts'] > 1 else 'instance'} {result['queued_resource']}"
    )
    text = (
        f"run {run_id}: {result['accelerator_type']} on {result['tier']} in {result['zone']} — {what}, "
        f"{result['hosts']} hosts ({len(result['attempts'])} attempt(s)); backend {spec.slice.resolved_backend} "
        f"({spec.slice.backend_reason})"
    )
    show(result, args.json, text)
    return 0
