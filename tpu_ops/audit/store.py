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
import itertools
import json
import re
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from tpu_ops.audit.reading import parse_record
from tpu_ops.audit.records import DIGEST_CHAIN, GENESIS, SEAL_EVENT, canonical, check_chain
from tpu_ops.audit.verify import Damage
from tpu_ops.cloud.translate import aws_error_code, is_aws_connection_error
from tpu_ops.errors import CloudError
from tpu_ops.uris import ObjectUri

T = TypeVar("T")
SEQ_WIDTH = 12
CLAIM_ATTEMPTS = 64
_RECORD_KEY = re.compile(r"/chains/([^/]+)/(\d{12})\.json$")
_ANY_CHAIN_KEY = re.compile(r"chains/([^/]+)/")
_BUNDLE_KEY = re.compile(r"/bundles/[^/]+/(\d{12})-(\d{12})\.jsonl$")


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
            code, status = aws_error_code(exc)
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

    def history(self) -> list[Damage]:
        """Non-current versions and delete markers under the trail: a write-once trail has neither."""
        return self.versions(self.trail.key("chains") + "/")[1]

    def versions(self, prefix: str) -> tuple[dict[str, str], list[Damage]]:
        """The current version id of every key under ``prefix``, and the history there as damage.

        (``ListObjectVersions``: moto's copies every stored version on each page unless patched, see
        ``infra/local/moto_patches``.)
        """
        current: dict[str, str] = {}
        history: list[Damage] = []
        pages = self.s3.get_paginator("list_object_versions").paginate(
            Bucket=self.trail.bucket,
            Prefix=prefix,
            PaginationConfig={"PageSize": 1000},  # S3's own default; moto's is 100
        )
        for page in pages:
            for v in page.get("Versions", []):
                if v.get("IsLatest"):
                    current[v["Key"]] = str(v.get("VersionId") or "null")
                else:
                    history.append(_history(v["Key"], f"non-current version of {v['Key']} (version "
                                                      f"{v.get('VersionId')}, {v.get('LastModified')}): the record "
                                                      "was overwritten"))  # fmt: skip
            for m in page.get("DeleteMarkers", []):
                history.append(_history(m["Key"], f"delete marker on {m['Key']} ({m.get('LastModified')}): the "
                                                  "record was hidden (its locked version is still there)"))  # fmt: skip
        return current, history

    # -- bundles: what a seal copied, so verify need not GET every record --------------------------
    def bundle_prefix(self, chain: str) -> str:
        return self.trail.key(f"bundles/{check_chain(chain)}") + "/"

    def last_bundled(self, chain: str) -> int:
        """The last seq of ``chain`` a bundle holds (0 if none)."""
        last = 0
        for key in self._list(self.bundle_prefix(chain)):
            m = _BUNDLE_KEY.search(key)
            if m:
                last = max(last, int(m.group(2)))
        return last

    def write_bundle(self, chain: str, head_seq: int, workers: int = 16) -> dict[str, Any] | None:
        """Copy ``chain``'s records after its last bundle up to ``head_seq`` into one write-once, locked
        bundle (each with the version id it was read at); its reference for the seal, or None.

        Verify takes a record from a bundle only while that version is still the key's current one,
        and only from a bundle whose sha256 a seal names; anything else it GETs.
        """
        last = self.last_bundled(chain)
        if head_seq <= last:
            return None
        wanted = [k for k in self.keys(chain, self.key(chain, last) if last else None) if _seq_of(k) <= head_seq]

        def fetch(key: str) -> tuple[str, str, bytes]:
            resp = self.s3.get_object(Bucket=self.trail.bucket, Key=key)  # the version read is the version bundled
            return key, str(resp.get("VersionId") or "null"), bytes(resp["Body"].read())

        lines: list[bytes] = []
        first = 0
        with ThreadPoolExecutor(workers) as pool:
            for key, vid, body in pool.map(fetch, wanted):
                record, _ = parse_record(body)
                if record is not None and record.get("chain") == chain and vid != "null":
                    lines.append(canonical({"k": key, "v": vid, "b": body.decode()}))
                    first = first or _seq_of(key)
        if not lines:
            return None
        data = b"\n".join(lines) + b"\n"
        key = f"{self.bundle_prefix(chain)}{first:0{SEQ_WIDTH}d}-{head_seq:0{SEQ_WIDTH}d}.jsonl"
        try:
            until = datetime.now(UTC) + self.retention
            self.s3.put_object(Bucket=self.trail.bucket, Key=key, Body=data, IfNoneMatch="*",
                               ChecksumAlgorithm="SHA256",
                               ObjectLockMode="COMPLIANCE", ObjectLockRetainUntilDate=until)  # fmt: skip
        except Exception as exc:
            code, status = aws_error_code(exc)
            if status in (409, 412) or code in ("PreconditionFailed", "ConditionalRequestConflict"):
                return None  # another sealer bundled the same range
            raise
        return {"chain": chain, "key": key, "sha256": hashlib.sha256(data).hexdigest(), "first": first,
                "last": head_seq, "records": len(lines)}  # fmt: skip

    def get_bytes(self, key: str, version_id: str | None = None) -> bytes:
        kw = {"VersionId": version_id} if version_id else {}
        return bytes(self.s3.get_object(Bucket=self.trail.bucket, Key=key, **kw)["Body"].read())

    def read_verified(self, workers: int = 16, window: int = 256) -> tuple[Iterator[tuple[str, bytes]], list[Damage]]:
        """Every current object under ``chains/`` as ``(key, body)`` in key order, for verify, and the damage
        the version listing shows (filled in as the iterator runs).

        One ``ListObjectVersions`` pass names each key's current version. Digests are read first (their
        key sorts first); a record a seal's bundle holds at exactly its current version comes from the
        bundle, any other object is fetched, in parallel, at most ``window`` at a time. Memory: one
        chain's bundles and the window.
        """
        current, problems = self.versions(self.trail.key("chains") + "/")
        problems = list(problems)
        refs: dict[str, list[dict[str, Any]]] = {}

        def chain_of(key: str) -> str:
            m = _ANY_CHAIN_KEY.search(key)
            return m.group(1) if m else "?"

        def fetch(key: str) -> bytes:
            return self.get_bytes(key, None if current[key] == "null" else current[key])

        def run() -> Iterator[tuple[str, bytes]]:
            with ThreadPoolExecutor(workers) as pool:
                for chain, group in itertools.groupby(sorted(current), key=chain_of):
                    keys = list(group)
                    held: dict[str, bytes] = {}
                    for ref in refs.get(chain, []):
                        held.update(self._bundle(ref, current, problems))
                    fetched = _window(pool, fetch, [k for k in keys if k not in held], window)
                    for key in keys:
                        body = held.pop(key) if key in held else next(fetched)
                        if chain == DIGEST_CHAIN and _RECORD_KEY.search(key):  # seals at record keys only
                            _bundle_refs(body, refs)
                        yield key, body

        return run(), problems

    def _bundle(self, ref: dict[str, Any], current: dict[str, str], problems: list[Damage]) -> dict[str, bytes]:
        """The records of the bundle ``ref`` names that are still their key's current version."""
        try:
            data = self.get_bytes(str(ref["key"]))
        except Exception as exc:
            if aws_error_code(exc)[1] == 404 or aws_error_code(exc)[0] == "NoSuchKey":
                problems.append(Damage("deleted", str(ref.get("chain")), None, str(ref["key"]),
                                       "a bundle a seal names is gone"))  # fmt: skip
                return {}
            raise
        if hashlib.sha256(data).hexdigest() != ref.get("sha256"):
            problems.append(Damage("edited", str(ref.get("chain")), None, str(ref["key"]),
                                   "this bundle does not match the sha256 its seal names"))  # fmt: skip
            return {}
        out: dict[str, bytes] = {}
        for line in data.split(b"\n"):
            if line:
                entry = json.loads(line)
                if current.get(entry["k"]) == entry["v"]:
                    out[entry["k"]] = entry["b"].encode()
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
        with ThreadPoolExecutor(workers) as pool:
            yield from _window(
                pool, lambda k: (k, self.get_bytes(k)), self._list(self.trail.key("chains") + "/"), window
            )


def _window(pool: ThreadPoolExecutor, fn: Callable[[str], T], keys: Iterable[str], window: int) -> Iterator[T]:
    """``fn(key)`` for each key, in order, at most ``window`` submitted and not yet taken."""
    pending: deque[Future[T]] = deque()
    it = iter(keys)
    try:
        for key in it:
            pending.append(pool.submit(fn, key))
            if len(pending) >= window:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        for f in pending:
            f.cancel()


def _seq_of(key: str) -> int:
    """The seq a record key names (a huge number for any other name, so it sorts and filters last)."""
    m = _RECORD_KEY.search(key)
    return int(m.group(2)) if m else 10**SEQ_WIDTH


def _bundle_refs(body: bytes, refs: dict[str, list[dict[str, Any]]]) -> None:
    """Collect the bundles a seal names (a digest that does not parse names none)."""
    record, _ = parse_record(body)
    if record is None or record.get("event") != SEAL_EVENT:
        return
    for ref in (record.get("params") or {}).get("bundles") or []:
        if isinstance(ref, dict) and isinstance(ref.get("chain"), str) and isinstance(ref.get("key"), str):
            refs.setdefault(ref["chain"], []).append(ref)


def _history(key: str, detail: str) -> Damage:
    m = _RECORD_KEY.search(key)
    return Damage("history", m.group(1) if m else "?", int(m.group(2)) if m else None, key, detail)


def is_unreachable(exc: BaseException) -> bool:
    """True for errors that mean "S3 is not answering now" (spool and retry later)."""
    if is_aws_connection_error(exc):
        return True
    if isinstance(exc, CloudError):
        return exc.status is None or exc.status >= 500
    return aws_error_code(exc)[1] >= 500
