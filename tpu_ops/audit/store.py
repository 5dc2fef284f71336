"""The audit trail in S3: one write-once object per record, in a bucket with Object Lock.

Layout under the trail's prefix: ``chains/<chain>/<seq:012d>.json``. A writer claims seq N by
creating that key with ``If-None-Match: *``: S3 lets exactly one create of a key succeed, so two
writers can never both take seq N. The loser gets 412 (or 409 when the creates overlap), re-reads
the head of the chain and tries N+1 on top of the winner's hash. Every record is stored in
compliance mode until ``now + retention``: nobody, root included, can delete or overwrite its
version before then.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from tpu_ops.audit.records import GENESIS, canonical, check_chain
from tpu_ops.errors import CloudError, IntegrityError
from tpu_ops.uris import ObjectUri

SEQ_WIDTH = 12
CLAIM_ATTEMPTS = 64


@dataclass(frozen=True)
class Head:
    """The newest record of a chain (seq 0 and ``GENESIS`` for an empty chain)."""

    seq: int
    hash: str
    event_id: str | None = None


class Conflict(Exception):
    """Another writer took this seq first."""


def _code(exc: Exception) -> tuple[str, int]:
    resp = getattr(exc, "response", None) or {}
    return str(resp.get("Error", {}).get("Code", "")), int(resp.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)


class S3Store:
    """Write-once records in ``trail`` (an ``s3://bucket/prefix``), through a botocore S3 client."""

    def __init__(self, s3: Any, trail: ObjectUri, retention_days: int) -> None:
        self.s3 = s3
        self.trail = trail
        self.retention = timedelta(days=retention_days)

    def chain_prefix(self, chain: str) -> str:
        return self.trail.key(f"chains/{check_chain(chain)}") + "/"

    def key(self, chain: str, seq: int) -> str:
        return f"{self.chain_prefix(chain)}{seq:0{SEQ_WIDTH}d}.json"

    def put_new(self, record: dict[str, Any]) -> str:
        """Create ``record``'s key, locked; raise ``Conflict`` if that seq is taken. Returns the request id."""
        try:
            resp = self.s3.put_object(
                Bucket=self.trail.bucket,
                Key=self.key(record["chain"], record["seq"]),
                Body=canonical(record),
                ContentType="application/json",
                IfNoneMatch="*",
                ObjectLockMode="COMPLIANCE",
                ObjectLockRetainUntilDate=datetime.now(UTC) + self.retention,
                ChecksumAlgorithm="SHA256",
            )
        except Exception as exc:
            code, status = _code(exc)
            if status in (409, 412) or code in ("PreconditionFailed", "ConditionalRequestConflict"):
                raise Conflict(record["seq"]) from exc
            raise
        return str(resp.get("ResponseMetadata", {}).get("RequestId", ""))

    def keys(self, chain: str, start_after: str | None = None) -> list[str]:
        """The record keys of ``chain`` in order (after ``start_after``)."""
        return list(self._list(self.chain_prefix(chain), start_after))

    def _list(self, prefix: str, start_after: str | None = None) -> Iterator[str]:
        kw: dict[str, Any] = {"Bucket": self.trail.bucket, "Prefix": prefix}
        if start_after:
            kw["StartAfter"] = start_after
        for page in self.s3.get_paginator("list_objects_v2").paginate(**kw):
            for obj in page.get("Contents", []):
                yield obj["Key"]

    def get(self, key: str) -> dict[str, Any]:
        body = self.s3.get_object(Bucket=self.trail.bucket, Key=key)["Body"].read()
        record: dict[str, Any] = json.loads(body)
        return record

    def head(self, chain: str, known: Head | None = None) -> Head:
        """The newest record of ``chain``; ``known`` (a head seen earlier) saves listing the whole chain."""
        start = self.key(chain, known.seq) if known and known.seq else None
        keys = self.keys(chain, start)
        if not keys:
            return known or Head(0, GENESIS)
        record = self.get(keys[-1])
        if record.get("chain") != chain or not isinstance(record.get("seq"), int):
            raise IntegrityError(f"audit chain {chain}: head object {keys[-1]} is not a record of this chain")
        return Head(record["seq"], str(record["hash"]), record.get("id"))

    def chains(self) -> list[str]:
        """Every chain in the trail."""
        resp = self.s3.get_paginator("list_objects_v2").paginate(
            Bucket=self.trail.bucket, Prefix=self.trail.key("chains") + "/", Delimiter="/"
        )
        out = []
        for page in resp:
            for p in page.get("CommonPrefixes", []):
                out.append(p["Prefix"].rstrip("/").rsplit("/", 1)[-1])
        return out

    def read_all(self, workers: int = 16) -> Iterator[tuple[str, bytes]]:
        """Every object under the trail's ``chains/`` as ``(key, body)``, in key order, fetched in parallel."""
        keys = list(self._list(self.trail.key("chains") + "/"))
        bucket = self.trail.bucket

        def fetch(key: str) -> tuple[str, bytes]:
            return key, bytes(self.s3.get_object(Bucket=bucket, Key=key)["Body"].read())

        with ThreadPoolExecutor(workers) as pool:
            yield from pool.map(fetch, keys)


def is_unreachable(exc: BaseException) -> bool:
    """True for errors that mean "S3 is not answering now" (spool and retry later)."""
    try:
        from botocore.exceptions import ConnectionError as BotoConnectionError
        from botocore.exceptions import HTTPClientError
    except ImportError:  # pragma: no cover - botocore ships with boto3
        return False
    if isinstance(exc, BotoConnectionError | HTTPClientError | ConnectionError | TimeoutError):
        return True
    if isinstance(exc, CloudError):
        return exc.status is None or exc.status >= 500
    _, status = _code(exc) if isinstance(exc, Exception) else ("", 0)
    return status >= 500
