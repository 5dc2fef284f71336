"""Fill the IAM templates in ``infra/iam/`` from a pipeline spec: ``{{NAME}}`` placeholders.

    python -m infra.iam.render --spec examples/pipeline.yaml --account 123456789012 \\
        --kms-key-arn arn:aws:kms:... --sagemaker-role-arn arn:aws:iam::...:role/... --out build/iam

Writes every template with its placeholders filled; refuses to write one that still has any.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from tpu_ops.errors import SpecError
from tpu_ops.specs import PipelineSpec, load_spec
from tpu_ops.uris import parse_uri

HERE = Path(__file__).resolve().parent
PLACEHOLDER = re.compile(r"\{\{([A-Z0-9_]+)\}\}")


def templates() -> list[Path]:
    """Every template: AWS policies (JSON) and GCP custom roles (YAML)."""
    return sorted([*HERE.glob("aws/*.json"), *HERE.glob("gcp/*.yaml")])


def values_from_spec(spec: PipelineSpec, **extra: str) -> dict[str, str]:
    """Placeholder values a spec determines (buckets, prefixes, group), plus ``extra`` (account, ARNs)."""
    src = parse_uri(spec.mirror.source, "s3")
    export = parse_uri(spec.export.destination, "s3")
    audit = parse_uri(spec.audit_bucket or "s3://tpu-ops-audit/trail", "s3")
    return {
        "SOURCE_BUCKET": src.bucket,
        "SOURCE_PREFIX": src.prefix.strip("/"),
        "EXPORT_BUCKET": export.bucket,
        "EXPORT_PREFIX": export.prefix.strip("/"),
        "AUDIT_BUCKET": audit.bucket,
        "AUDIT_PREFIX": audit.prefix.strip("/"),
        "MODEL_PACKAGE_GROUP": spec.export.model_package_group,
        "ENDPOINT_NAME": spec.export.model_package_group,  # `tpu-ops deploy --endpoint` names it; override
        **extra,
    }


def render(text: str, values: dict[str, str]) -> str:
    """``text`` with every ``{{NAME}}`` replaced; ``KeyError`` naming the first one without a value."""
    return PLACEHOLDER.sub(lambda m: values[m.group(1)], text)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m infra.iam.render", description=__doc__)
    p.add_argument("--spec", type=Path, required=True)
    p.add_argument("--account", required=True, help="AWS account id")
    p.add_argument("--region", default="us-east-1")
    p.add_argument("--kms-key-arn", required=True)
    p.add_argument("--sagemaker-role-arn", required=True)
    p.add_argument("--sts-subject-id", default="", help="Storage Transfer service agent's subjectId")
    p.add_argument("--endpoint", help="the SageMaker endpoint deploys go to (default: the model package group)")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    try:
        spec = load_spec(args.spec, PipelineSpec)
    except SpecError as exc:  # a train job spec, a typo: the fields, as `tpu-ops validate` lists them, no traceback
        print(f"error: the IAM templates are rendered from a pipeline spec; {exc}", file=sys.stderr)
        return 2
    values = values_from_spec(
        spec,
        AWS_ACCOUNT_ID=args.account,
        AWS_REGION=args.region,
        AUDIT_KMS_KEY_ARN=args.kms_key_arn,
        SAGEMAKER_EXECUTION_ROLE_ARN=args.sagemaker_role_arn,
        STS_SERVICE_AGENT_SUBJECT_ID=args.sts_subject_id or "SUBJECT_ID",
        **({"ENDPOINT_NAME": args.endpoint} if args.endpoint else {}),
    )
    for path in templates():
        target = args.out / path.relative_to(HERE)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(render(path.read_text(), values))
        print(target)
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
