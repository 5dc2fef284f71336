"""The audit trail in S3: one write-once object per record, in a bucket with Object Lock.

Layout under the trail's prefix: ``chains/<chain>/<seq:012d>.json``. A writer claims seq N by
creating that key with ``If-None-Match: *``: S3 lets exactly one create of a key succeed, so two
writers can never both take seq N. The loser gets 412 (or 409 when the creates overlap), re-reads
the head of the chain and tries N+1 on top of the winner's hash. Every record is stored in
compliance mode until ``now + retention``: nobody, root included, can delete or overwrite its
version before then.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from tpu_ops.audit.records import GENESIS, canonical, check_chain
from tpu_ops.audit.verify import Damage, parse_record
from tpu_ops.errors import CloudError
from tpu_ops.uris import ObjectUri

SEQ_WIDTH = 12
CLAIM_ATTEMPTS = 64
_RECORD_KEY = re.compile(r"/chains/([^/]+)/(\d{12})\.json$")


@dataclass(frozen=True)
class Foreign:
    """An object at a record key that is not a record of its chain: it holds its seq for ever."""

    key: str
    seq: int
    sha256: str
    size: int
    problem: str


@dataclass(frozen=True)
class Head:
    """The newest record of a chain (seq 0 and ``GENESIS`` for an empty chain).

    ``seq`` is the newest seq taken, by a record or by foreign objects (``skipped``, newest first);
    ``hash`` is the hash of the newest record: the next record claims ``seq + 1`` after it.
    """

    seq: int
    hash: str
    event_id: str | None = None
    skipped: tuple[Foreign, ...] = ()
    hash_seq: int | None = None  # the seq of the record ``hash`` belongs to, when foreign objects follow it

    @property
    def sealed_seq(self) -> int:
        """The seq of the newest record (what a digest names)."""
        return self.seq if self.hash_seq is None else self.hash_seq


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
        """The newest record of ``chain``; ``known`` (a head seen earlier) saves listing the whole chain.

        Objects whose names are not record keys are passed over (verify names them). An object at a
        record key that is not a record of this chain (torn, planted) still holds its seq, since its
        key can never be created again: it is returned in ``skipped`` and the chain goes on after it
        from the newest real record, so one foreign object never wedges the chain.
        """
        start = self.key(chain, known.seq) if known and known.seq else None
        skipped: list[Foreign] = []
        for key in reversed(self.keys(chain, start)):
            m = _RECORD_KEY.search(key)
            if m is None:
                continue
            seq = int(m.group(2))
            body = self.get_bytes(key)
            record, problem = parse_record(body)
            if record is None or record.get("chain") != chain or record.get("seq") != seq:
                why = str(problem) if record is None else f"a record of chain {record['chain']} seq {record['seq']}"
                skipped.append(Foreign(key, seq, hashlib.sha256(body).hexdigest(), len(body), why))
                continue
            top = skipped[0].seq if skipped else seq
            return Head(top, str(record["hash"]), record.get("id"), tuple(skipped), seq)
        base = known or Head(0, GENESIS)
        if skipped:
            return Head(skipped[0].seq, base.hash, None, tuple(skipped), base.sealed_seq)
        return base

    def get_bytes(self, key: str) -> bytes:
        return bytes(self.s3.get_object(Bucket=self.trail.bucket, Key=key)["Body"].read())

    def history(self) -> list[Damage]:
        """Non-current versions and delete markers under the trail: a write-once trail has neither.

        (``ListObjectVersions``; moto's copies every stored version on each page unless patched, see
        ``infra/local/moto_patches``.)
        """
        out: list[Damage] = []
        pages = self.s3.get_paginator("list_object_versions").paginate(
            Bucket=self.trail.bucket, Prefix=self.trail.key("chains") + "/"
        )
        for page in pages:
            for v in page.get("Versions", []):
                if not v.get("IsLatest"):
                    out.append(_history(v["Key"], f"non-current version of {v['Key']} (version {v.get('VersionId')}, "
                                                  f"{v.get('LastModified')}): the record was overwritten"))  # fmt: skip
            for m in page.get("DeleteMarkers", []):
                out.append(_history(m["Key"], f"delete marker on {m['Key']} ({m.get('LastModified')}): the record "
                                              "was hidden (its locked version is still there)"))  # fmt: skip
        return out

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

    def read_all(self, workers: int = 16, window: int = 256) -> Iterator[tuple[str, bytes]]:
        """Every object under the trail's ``chains/`` as ``(key, body)``, in key order, fetched in parallel.

        Keys are listed page by page while bodies are fetched; at most ``window`` bodies are in
        flight or waiting to be taken, so memory stays bounded whatever the trail's size.
        """

        def fetch(key: str) -> tuple[str, bytes]:
            return key, self.get_bytes(key)

        pending: deque[Future[tuple[str, bytes]]] = deque()
        with ThreadPoolExecutor(workers) as pool:
            try:
                for key in self._list(self.trail.key("chains") + "/"):
                    pending.append(pool.submit(fetch, key))
                    if len(pending) >= window:
                        yield pending.popleft().result()
                while pending:
                    yield pending.popleft().result()
            finally:
                for f in pending:
                    f.cancel()


def _history(key: str, detail: str) -> Damage:
    m = _RECORD_KEY.search(key)
    return Damage("history", m.group(1) if m else "?", int(m.group(2)) if m else None, key, detail)


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
