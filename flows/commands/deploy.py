"""``tpu-ops deploy ARN``: create or update a SageMaker endpoint from an approved model package."""

from __future__ import annotations

import argparse

from flows.commands._common import show
from tpu_ops.errors import SpecError


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    d = sub.add_parser("deploy", help="Create or update a SageMaker endpoint from an APPROVED model package.")
    d.add_argument("arn", metavar="ARN", help="the model package ARN (must be Approved)")
    d.add_argument("--endpoint", required=True, help="endpoint name (created if missing, else updated)")
    d.add_argument("--instance-type", default="ml.m5.large")
    d.add_argument("--instance-count", type=int, default=1)
    d.add_argument("--json", action="store_true")
    d.add_argument("--no-flow", action="store_true", help="call the library directly (no Prefect API needed)")
    d.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if args.instance_count < 1 or args.instance_count > 100:
        raise SpecError(f"--instance-count {args.instance_count} is not between 1 and 100")
    if args.no_flow:
        from flows.settings import resolve_settings
        from tpu_ops.cloud.clients import Clients
        from tpu_ops.export.steps import deploy

        out = deploy(Clients(resolve_settings()), args.arn, args.endpoint, args.instance_type, args.instance_count)
    else:
        from flows.export import deploy_model

        out = deploy_model(args.arn, args.endpoint, args.instance_type, args.instance_count)
    verb = "created" if out["created"] else "updated"
    show(out, args.json, f"endpoint {out['endpoint']} {verb} from {args.arn} ({out['endpoint_arn']})")
    return 0
