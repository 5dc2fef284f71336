"""Checking the trail where it lives: read it (S3, or a JSONL file a dry run kept), pin the KMS key,
verify. Written once for ``tpu-ops audit verify`` and for the pipeline's summary."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tpu_ops.audit.store import S3Store
from tpu_ops.audit.trail import audit_clients
from tpu_ops.audit.verify import Report, item_from_object, items_from_jsonl, verify
from tpu_ops.cloud.clients import Clients
from tpu_ops.cloud.translate import aws_errors
from tpu_ops.errors import SpecError
from tpu_ops.uris import parse_s3


def read_trail(clients: Clients, source: str | None = None, *, history: bool = False) -> tuple[list[Any], list[Any]]:
    """The trail's items (``source``: an s3:// prefix or a JSONL file; default the settings' trail) and,
    with ``history``, what S3's version history says (non-current versions, delete markers)."""
    src = source or clients.settings.audit_uri
    if src.startswith("s3://"):
        try:
            trail = parse_s3(src)
        except ValueError as exc:
            raise SpecError(f"SOURCE: {exc}") from None
        store = S3Store(audit_clients(clients)[0], trail, 1)
        with aws_errors("s3"):
            if not history:
                return [item_from_object(k, b) for k, b in store.read_all()], []
            # parallel, bounded, and from the seals' bundles where S3 still holds exactly those versions
            objects, problems = store.read_verified()
            return [item_from_object(k, b) for k, b in objects], problems
    path = Path(src)
    if not path.is_file():
        raise SpecError(f"SOURCE {src!r} is neither an s3:// prefix nor a JSONL file")
    return items_from_jsonl(path), []


def pinned_key(clients: Clients, key: str) -> tuple[Any, str]:
    """The KMS client and the ARN of ``key``, the one key whose digest signatures are trusted."""
    kms = audit_clients(clients)[1]
    with aws_errors("kms"):
        return kms, str(kms.describe_key(KeyId=key)["KeyMetadata"]["Arn"])


def check_trail(clients: Clients, source: str | None = None, *, key: str | None = None) -> Report:
    """The trail verified end to end: chains, digests, and signatures when ``key`` is pinned."""
    items, _ = read_trail(clients, source)
    kms, trusted = pinned_key(clients, key) if key else (None, None)
    return verify(items, kms, trusted)
