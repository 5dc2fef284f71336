"""``tpu-ops doctor [--spec FILE] [--json]``: check the environment before the first run."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tpu_ops.doctor import Check

MARK = {"ok": "OK", "missing": "MISSING", "skipped": "SKIPPED"}


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "doctor",
        help="Check APIs, permissions and the resources a spec names, before the first run; says how to fix gaps.",
        description="Reads only: reachable APIs, GCS permissions (testIamPermissions), TPU locations, accelerator "
        "types and reservations, S3 buckets and the audit bucket's Object Lock, the SageMaker model package "
        "group, the audit KMS key, and the Prefect API. Exit status 1 when something is missing.",
    )
    p.add_argument("--spec", type=Path, help="a pipeline spec: check the buckets, zones and names it uses")
    p.add_argument("--kms-key", help="the audit signing key (default: TPU_OPS_AUDIT_KMS_KEY_ID)")
    p.add_argument("--json", action="store_true", help="print the checks as JSON")
    p.set_defaults(handler=run)


def _prefect_check() -> Check:
    """The Prefect API, if one is configured (PREFECT_API_URL); otherwise skipped."""
    from prefect.settings import PREFECT_API_URL

    from tpu_ops.doctor import MISSING, OK, SKIPPED, Check

    url = PREFECT_API_URL.value()
    if not url:
        return Check("prefect api", SKIPPED, "PREFECT_API_URL is not set (flows run on a temporary server)")
    from flows.commands.serve import check_api
    from tpu_ops.errors import TpuOpsError

    try:
        check_api()
    except TpuOpsError as exc:
        return Check("prefect api", MISSING, str(exc), exc.fix or "start one with `make ui`")
    return Check("prefect api", OK, url)


def run(args: argparse.Namespace) -> int:
    from flows.commands._specs import expect_kind
    from tpu_ops.doctor import failed, run_checks
    from tpu_ops.settings import Settings
    from tpu_ops.specs import PipelineSpec, load_spec

    if args.spec:  # a train job or provision spec: one line naming its kind, not "Field required" x 3
        expect_kind(args.spec, "pipeline", "tpu-ops doctor --spec")
    spec = load_spec(args.spec, PipelineSpec) if args.spec else None
    checks = [*run_checks(Settings(), spec, args.kms_key), _prefect_check()]
    missing = failed(checks)
    if args.json:
        print(json.dumps({"ok": not missing, "checks": [c.to_json() for c in checks]}, indent=2))
    else:
        width = max(len(c.name) for c in checks)
        for c in checks:
            print(f"{MARK[c.status]:<8} {c.name:<{width}}  {c.detail}")
            if c.fix:
                print(f"{'':<8} {'':<{width}}  fix: {c.fix}")
        print(f"\n{len(missing)} missing" if missing else "\nall checks passed")
    return 1 if missing else 0
