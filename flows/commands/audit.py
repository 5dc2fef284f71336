"""``tpu-ops audit verify | lineage | flush``: check the trail, show a model's lineage, send the spool."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from tpu_ops.errors import SpecError


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("audit", help="Verify the tamper-evident audit trail; show a model's lineage.")
    cmds = p.add_subparsers(dest="audit_command", metavar="SUBCOMMAND", required=True)
    v = cmds.add_parser(
        "verify",
        help="Check every chain and signed digest; exit 0 if intact, else name the first bad record.",
        description="SOURCE is an s3://bucket/prefix trail (default: the configured one) or a JSONL file of "
        "records. Damage is named: edited, deleted, reordered, inserted, truncated (after the last digest), "
        "forged-digest. Exit 0 intact, 1 damaged.",
    )
    v.add_argument("source", nargs="?", metavar="SOURCE", help="s3:// trail prefix or JSONL file")
    v.add_argument("--no-signatures", action="store_true", help="skip KMS signature checks of digests")
    v.add_argument("--json", action="store_true", help="print the report as JSON")
    v.set_defaults(handler=run_verify)
    lin = cmds.add_parser("lineage", help="dataset → run → checkpoint → artifact → package → approval → endpoint")
    lin.add_argument("target", metavar="ARN_OR_RUN_ID", help="a model package ARN or a run id")
    lin.add_argument("--json", action="store_true", help="print the lineage as JSON")
    lin.add_argument(
        "--trail",
        type=Path,
        metavar="JSONL",
        help="read the run's records from this JSONL trail (a dry run keeps one) instead of S3; the goodput "
        "report beside it (goodput.json) is used too; SageMaker is not asked",
    )
    lin.set_defaults(handler=run_lineage)
    f = cmds.add_parser("flush", help="Send records spooled while S3 was unreachable, in order.")
    f.set_defaults(handler=run_flush)
    dump = cmds.add_parser("dump", help="Write every record of an s3:// trail as JSONL (to verify offline).")
    dump.add_argument("source", nargs="?", metavar="S3_URI")
    dump.set_defaults(handler=run_dump)


def _settings() -> Any:
    from flows.settings import resolve_settings

    return resolve_settings()


def _items(source: str | None, settings: Any) -> tuple[list[Any], Any]:
    from tpu_ops.audit.store import S3Store
    from tpu_ops.audit.trail import audit_clients
    from tpu_ops.audit.verify import items_from_jsonl, items_from_objects
    from tpu_ops.uris import parse_s3

    s3, kms = audit_clients(settings)
    src = source or settings.audit_uri
    if src.startswith("s3://"):
        try:
            trail = parse_s3(src)
        except ValueError as exc:
            raise SpecError(f"SOURCE: {exc}") from None
        return items_from_objects(S3Store(s3, trail, 1).read_all()), kms
    path = Path(src)
    if not path.is_file():
        raise SpecError(f"SOURCE {src!r} is neither an s3:// prefix nor a JSONL file")
    return items_from_jsonl(path), kms


def run_verify(args: argparse.Namespace) -> int:
    from tpu_ops.audit.verify import verify

    settings = _settings()
    items, kms = _items(args.source, settings)
    if not items:
        print(f"error: no audit records in {args.source or settings.audit_uri}", file=sys.stderr)
        return 1
    trusted = None
    if args.no_signatures:
        kms = None
    elif settings.audit_kms_key_id:
        trusted = kms.describe_key(KeyId=settings.audit_kms_key_id)["KeyMetadata"]["Arn"]
    report = verify(items, kms, trusted)
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        sigs = "signatures checked" if report.signatures_checked else "signatures NOT checked"
        head = f"{report.records} records in {report.chains} chains, {report.digests} digests ({sigs})"
        if report.ok:
            print(f"intact: {head}")
            for chain, n in sorted(report.unsealed.items()):
                if n:
                    print(f"  note: chain {chain} has {n} record(s) after its last digest (not sealed yet)")
        else:
            first = report.damage[0]
            print(f"DAMAGED: {head}", file=sys.stderr)
            print(f"first bad record: {first.describe()}", file=sys.stderr)
            for d in report.damage[1:]:
                print(f"  also: {d.describe()}", file=sys.stderr)
    return 0 if report.ok else 1


def run_lineage(args: argparse.Namespace) -> int:
    from flows.audit import trail_for
    from tpu_ops.audit.lineage import render
    from tpu_ops.cloud.clients import storage_client
    from tpu_ops.cloud.session import shared_client
    from tpu_ops.export.release import load_lineage

    if args.trail:
        lin = _offline_lineage(args.target, args.trail)
    else:
        settings = _settings()
        lin = load_lineage(args.target, sm=shared_client(settings, "sagemaker"), gcs=storage_client(settings),
                           trail=trail_for(settings))  # fmt: skip
    print(json.dumps(lin, indent=2, default=str) if args.json else render(lin))
    return 0


def _offline_lineage(run_id: str, path: Path) -> dict[str, Any]:
    """A run's lineage from a JSONL trail file (and the goodput.json beside it), no cloud asked."""
    from tpu_ops.audit import lineage
    from tpu_ops.audit.records import DIGEST_CHAIN
    from tpu_ops.audit.verify import items_from_jsonl
    from tpu_ops.errors import NotFoundError

    if not path.is_file():
        raise SpecError(f"--trail {str(path)!r} is not a file")
    records = [it.record for it in items_from_jsonl(path) if it.record is not None]
    mine = sorted((r for r in records if r.get("chain") == run_id), key=lambda r: int(r.get("seq") or 0))
    if not mine:
        raise NotFoundError(f"no audit records for run {run_id} in {path}")
    digests = [r for r in records if r.get("chain") == DIGEST_CHAIN and (r.get("params") or {}).get("chain") == run_id]
    digest = max(digests, key=lambda r: int(r.get("seq") or 0)) if digests else None
    goodput_file = path.with_name("goodput.json")
    goodput = json.loads(goodput_file.read_text()) if goodput_file.is_file() else None
    return lineage.build(run_id, mine, goodput, None, digest)


def run_flush(args: argparse.Namespace) -> int:
    from flows.audit import trail_for

    trail = trail_for(_settings())
    sent = trail.flush()
    print(f"{sent} spooled record(s) sent; {trail.spool.pending()} waiting")
    return 0


def run_dump(args: argparse.Namespace) -> int:
    settings = _settings()
    items, _ = _items(args.source or settings.audit_uri, settings)
    for it in items:
        print(json.dumps(it.record, sort_keys=True, separators=(",", ":"), ensure_ascii=False))
    return 0
