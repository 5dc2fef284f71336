"""``tpu-ops approve ARN``: approve (or reject) a model package pending manual approval; audited."""

from __future__ import annotations

import argparse

from flows.commands._common import show


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    a = sub.add_parser("approve", help="Approve (or --reject) a model package pending manual approval; audited.")
    a.add_argument("arn", metavar="ARN", help="the model package ARN")
    a.add_argument("--approver", required=True, help="who approves (recorded in SageMaker and the audit trail)")
    a.add_argument("--reject", action="store_true", help="reject instead (needs --reason)")
    a.add_argument("--reason", default="", help="why (required with --reject)")
    a.add_argument("--json", action="store_true")
    a.add_argument("--no-flow", action="store_true", help="call the library directly (no Prefect API needed)")
    a.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if args.no_flow:
        from flows.settings import resolve_settings
        from tpu_ops.cloud.clients import Clients
        from tpu_ops.export.steps import approve

        out = approve(Clients(resolve_settings()), args.arn, args.approver, args.reject, args.reason)
    else:
        from flows.export import approve_model

        out = approve_model(args.arn, args.approver, args.reject, args.reason)
    show(out, args.json, f"{out['arn']}: {out['status']} by {args.approver}")
    return 0
