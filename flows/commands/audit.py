"""``tpu-ops audit verify | lineage | flush``: check the trail, show a model's lineage, send the spool."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from tpu_ops.errors import SpecError

EXIT_INTACT, EXIT_DAMAGED, EXIT_USAGE, EXIT_UNCHECKED = 0, 1, 2, 3
EXIT_CODES = (
    "Exit codes: 0 intact; 1 damaged (the damage is named); 2 usage error; 3 could not check: S3 or KMS "
    "unreachable, access denied or no credentials (this says nothing about the trail)."
)


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("audit", help="Verify the tamper-evident audit trail; show a model's lineage.")
    cmds = p.add_subparsers(dest="audit_command", metavar="SUBCOMMAND", required=True)
    v = cmds.add_parser(
        "verify",
        help="Check every chain and signed digest; exit 0 if intact, else name the bad records.",
        description="SOURCE is an s3://bucket/prefix trail (default: the configured one) or a JSONL file of "
        "records. Damage is named: malformed, foreign, edited, deleted, reordered, inserted, truncated, "
        "forged-digest, stale (the newest digest is older than the seal interval allows: the end may have been "
        "cut off), gap (seals missed), history (S3 versions or delete markers under the trail). Digest "
        "signatures are checked only against the pinned key (--key, else TPU_OPS_AUDIT_KMS_KEY_ID); without "
        "one verify says 'signatures not checked'. " + EXIT_CODES,
    )
    v.add_argument("source", nargs="?", metavar="SOURCE", help="s3:// trail prefix or JSONL file")
    v.add_argument("--key", metavar="KMS_KEY", help="pin the key digests must be signed by (ARN, id or alias)")
    v.add_argument("--no-signatures", action="store_true", help="skip KMS signature checks of digests")
    v.add_argument("--json", action="store_true", help="print the report as JSON")
    v.set_defaults(handler=run_verify, failure_exit=EXIT_UNCHECKED)  # exit 1 means damage here
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
    seal = cmds.add_parser(
        "seal",
        help="Write the scheduled seal: a signed digest naming every chain's head (run it every interval).",
        description="Writes one KMS-signed digest naming the head of every chain, even when nothing happened. "
        "Run it every TPU_OPS_AUDIT_SEAL_INTERVAL_S seconds (the served `seal-audit-trail` deployment does): "
        "verify then detects a trail cut off at its end within one interval.",
    )
    seal.set_defaults(handler=run_seal)
    dump = cmds.add_parser("dump", help="Write every record of an s3:// trail as JSONL (to verify offline).")
    dump.add_argument("source", nargs="?", metavar="S3_URI")
    dump.set_defaults(handler=run_dump)


def _settings() -> Any:
    from flows.settings import resolve_settings

    return resolve_settings()


def _unchecked(what: str, exc: Exception) -> int:
    from flows.failures import one_line
    from tpu_ops.errors import AccessDeniedError, TransientError

    if isinstance(exc, AccessDeniedError):
        why = "access denied or no credentials"
    elif isinstance(exc, TransientError):
        why = "unreachable"
    else:
        why = "failed"
    # one line: what could not be checked, then what is missing and its fix (as every command says it)
    detail = one_line(exc).removeprefix("error: ")
    print(f"error: {what}: {why}, so nothing is known about the trail's integrity (exit 3): {detail}", file=sys.stderr)
    return EXIT_UNCHECKED


def run_verify(args: argparse.Namespace) -> int:
    from tpu_ops.audit.check import pinned_key, read_trail
    from tpu_ops.audit.verify import verify
    from tpu_ops.cloud.clients import Clients
    from tpu_ops.errors import CloudError

    settings = _settings()
    clients = Clients(settings)
    try:
        items, history = read_trail(clients, args.source, history=True)
    except CloudError as exc:
        return _unchecked(f"cannot read the trail {args.source or settings.audit_uri}", exc)
    if not items:
        print(f"error: no audit records in {args.source or settings.audit_uri}", file=sys.stderr)
        return EXIT_DAMAGED
    key = args.key or settings.audit_kms_key_id
    kms, trusted, note = None, None, ""
    if args.no_signatures:
        note = "signatures not checked: --no-signatures"
    elif not key:
        note = ("signatures not checked: no key pinned (TPU_OPS_AUDIT_KMS_KEY_ID or --key), so a digest signed "
                "by any key would pass")  # fmt: skip
    try:
        if key and not args.no_signatures:
            kms, trusted = pinned_key(clients, key)
        report = verify(items, kms, trusted, seal_interval_s=settings.audit_seal_interval_s or None, history=history)
    except CloudError as exc:
        return _unchecked("cannot check digest signatures: KMS", exc)
    if args.json:
        print(json.dumps({**report.to_json(), "signatures_note": note, "key": trusted}, indent=2, default=str))
        return EXIT_INTACT if report.ok else EXIT_DAMAGED
    sigs = "signatures checked" if report.signatures_checked else note
    head = f"{report.counts()} ({sigs})"
    age = ""
    if report.newest_digest is not None and report.newest_digest_age_s is not None:
        age = (f"newest digest: seq {report.newest_digest['seq']} at {report.newest_digest['time']}, "
               f"{report.newest_digest_age_s:.0f} s old (seals due every {report.seal_interval_s} s)")  # fmt: skip
    if report.ok:
        print(f"intact: {head}")
        if trusted:
            print(f"  pinned key: {trusted}")
        if age:
            print(f"  {age}")
        for chain, n in sorted(report.unsealed.items()):
            if n:
                print(f"  note: chain {chain} has {n} record(s) after its last digest (not sealed yet)")
        return EXIT_INTACT
    first = report.damage[0]
    print(f"DAMAGED: {head}", file=sys.stderr)
    if age:
        print(f"  {age}", file=sys.stderr)
    print(f"first bad record: {first.describe()}", file=sys.stderr)
    for d in report.damage[1:]:
        print(f"  also: {d.describe()}", file=sys.stderr)
    return EXIT_DAMAGED


def run_seal(args: argparse.Namespace) -> int:
    from flows.audit import trail_for
    from tpu_ops.cloud.translate import aws_errors

    settings = _settings()
    trail = trail_for(settings)
    with aws_errors("s3"):
        written = trail.seal(interval_s=settings.audit_seal_interval_s or None)
    rec = written.record or {}
    heads = rec.get("params", {}).get("heads", {})
    print(f"sealed {len(heads)} chain(s): digest seq {rec.get('seq')} at {rec.get('time')}")
    return 0


def run_lineage(args: argparse.Namespace) -> int:
    from tpu_ops.audit.lineage import render
    from tpu_ops.cloud.clients import Clients
    from tpu_ops.export.release import load_lineage

    lin = _offline_lineage(args.target, args.trail) if args.trail else load_lineage(args.target, Clients(_settings()))
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
    drained = trail.drain()
    text = f"{drained.sent} spooled record(s) sent; {trail.spool.pending()} waiting"
    if drained.quarantined:
        text += f"; {len(drained.quarantined)} damaged line(s) quarantined in {trail.spool.quarantine_path} (audited)"
    print(text)
    for chain, why in sorted(drained.stuck.items()):
        print(f"  chain {chain} held back: {why}", file=sys.stderr)
    return 0


def run_dump(args: argparse.Namespace) -> int:
    from tpu_ops.audit.store import S3Store
    from tpu_ops.audit.trail import audit_clients
    from tpu_ops.cloud.translate import aws_errors
    from tpu_ops.uris import parse_s3

    settings = _settings()
    src = args.source or settings.audit_uri
    try:
        trail = parse_s3(src)
    except ValueError as exc:
        raise SpecError(f"S3_URI: {exc}") from None
    with aws_errors("s3"):
        for _key, body in S3Store(audit_clients(settings)[0], trail, 1).read_all():
            # one line per object, as stored (canonical JSON never holds a raw newline; garbage might)
            print(body.decode("utf-8", "replace").replace("\n", " "))
    return 0
