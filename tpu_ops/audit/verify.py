"""Verify an audit trail (an ``s3://`` trail prefix or a JSONL file) and name the first damage.

Kinds of damage, as ``validate-logs`` names them for CloudTrail:

- ``edited``: a record's content no longer matches its hash, or its hash was recomputed so the
  next record's ``prev_hash`` no longer matches it (or the record a digest names has changed);
- ``deleted``: a seq is missing in the middle of a chain;
- ``reordered``: records out of seq order (in S3: a record stored under another seq's key);
- ``inserted``: a record the chain does not continue from (a second claim on a seq, or a record
  whose ``prev_hash`` names an earlier record that already has a successor);
- ``truncated``: a chain ends before the head its last digest names;
- ``forged-digest``: a digest whose KMS signature does not verify, or signed by another key.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tpu_ops.audit.records import DIGEST_CHAIN, GENESIS, record_hash

KINDS = ("edited", "deleted", "reordered", "inserted", "truncated", "forged-digest")
_KEY = re.compile(r"chains/([^/]+)/(\d+)\.json$")


@dataclass
class Item:
    """One stored record: where it is (key or line), the seq its key says, its parsed body."""

    where: str
    record: dict[str, Any] | None
    key_chain: str | None = None
    key_seq: int | None = None


@dataclass(frozen=True)
class Damage:
    """The first bad record of one chain and what is wrong with it."""

    kind: str
    chain: str
    seq: int | None
    where: str
    detail: str

    def describe(self) -> str:
        at = f"seq {self.seq}" if self.seq is not None else "chain"
        return f"{self.kind}: chain {self.chain} {at} ({self.where}): {self.detail}"


@dataclass
class Report:
    """What verify found: counts, damage (empty when intact), records not yet sealed by a digest."""

    records: int = 0
    chains: int = 0
    digests: int = 0
    signatures_checked: bool = False
    damage: list[Damage] = field(default_factory=list)
    unsealed: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.damage

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}


def items_from_jsonl(path: Path) -> list[Item]:
    """Records of a JSONL file, one per line, in file order."""
    out = []
    with open(path, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if line.strip():
                out.append(Item(f"line {n}", _parse(line.encode())))
    return out


def items_from_objects(objects: Iterable[tuple[str, bytes]]) -> list[Item]:
    """Records of ``(key, body)`` pairs from S3; the key's chain and seq are checked too."""
    out = []
    for key, body in objects:
        m = _KEY.search(key)
        out.append(Item(key, _parse(body), m.group(1) if m else None, int(m.group(2)) if m else None))
    return out


def _parse(body: bytes) -> dict[str, Any] | None:
    try:
        obj = json.loads(body)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


def verify(items: list[Item], kms: Any = None, trusted_key: str | None = None) -> Report:
    """Check every chain and the digest chain; ``kms`` (a KMS client) checks digest signatures."""
    chains: dict[str, list[Item]] = {}
    report = Report(records=len(items), signatures_checked=kms is not None)
    for it in items:
        rec = it.record
        name = rec.get("chain") if rec else it.key_chain
        chains.setdefault(str(name or it.key_chain or "?"), []).append(it)
    report.chains = len([c for c in chains if c != DIGEST_CHAIN])
    accepted: dict[str, list[dict[str, Any]]] = {}
    for name in sorted(chains, key=lambda c: (c == DIGEST_CHAIN, c)):
        sig = _signature_check(kms, trusted_key) if name == DIGEST_CHAIN else None
        good, damage = _walk(name, chains[name], sig)
        accepted[name] = good
        if damage:
            report.damage.append(damage)
    digests = accepted.get(DIGEST_CHAIN, [])
    report.digests = len(digests)
    damaged = {d.chain for d in report.damage}
    for name, (damage, unsealed) in _against_digests(digests, accepted, damaged).items():
        if damage:
            report.damage.append(damage)
        elif unsealed:
            report.unsealed[name] = unsealed
    return report


def _signature_check(kms: Any, trusted_key: str | None) -> Any:
    if kms is None:
        return None
    from tpu_ops.audit.trail import verify_signature

    def check(rec: dict[str, Any]) -> str | None:
        if trusted_key and rec.get("key_id") != trusted_key:
            return f"signed by {rec.get('key_id')!r}, not the trail's key {trusted_key!r}"
        if not verify_signature(kms, rec):
            return "its KMS signature does not verify"
        return None

    return check


def _walk(chain: str, items: list[Item], sig: Any) -> tuple[list[dict[str, Any]], Damage | None]:
    """Accept records in order until the first damage; returns what was accepted and the damage."""
    good: list[dict[str, Any]] = []
    prev_hash = GENESIS

    def bad(kind: str, it: Item, seq: int | None, detail: str) -> tuple[list[dict[str, Any]], Damage]:
        return good, Damage(kind, chain, seq, it.where, detail)

    for i, it in enumerate(items):
        rec = it.record
        if rec is None or not isinstance(rec.get("seq"), int) or rec.get("hash") != record_hash(rec):
            seq = rec.get("seq") if rec and isinstance(rec.get("seq"), int) else it.key_seq
            return bad("edited", it, seq, "its content does not match its hash")
        seq = rec["seq"]
        if it.key_chain is not None and it.key_chain != chain:
            return bad("inserted", it, seq, f"a record of chain {chain} stored in chain {it.key_chain}")
        if it.key_seq is not None and it.key_seq != seq:
            return bad("reordered", it, seq, f"stored under seq {it.key_seq}'s key")
        if sig and (why := sig(rec)):
            return bad("forged-digest", it, seq, why)
        expected = len(good) + 1
        rest = items[i + 1 :]
        if seq == expected and rec.get("prev_hash") == prev_hash:
            good.append(rec)
            prev_hash = rec["hash"]
            continue
        if seq == expected:
            if any(x.record and x.record.get("prev_hash") == prev_hash for x in rest):
                return bad("inserted", it, seq, f"the chain continues from seq {expected - 1}, not from this record")
            if good:
                detail = f"its hash no longer matches the prev_hash of seq {seq}"
                return bad("edited", _where(items, good[-1]), good[-1]["seq"], detail)
            return bad("edited", it, seq, "its prev_hash is not the chain's genesis")
        if seq > expected:
            if any(x.record and x.record.get("seq") == expected for x in rest):
                return bad("reordered", it, seq, f"seq {seq} comes before seq {expected}")
            missing = f"seq {expected}" if seq == expected + 1 else f"seqs {expected}-{seq - 1}"
            return bad("deleted", it, expected, f"{missing} missing before this record")
        return _older_seq(chain, it, rec, good, rest)
    return good, None


def _older_seq(
    chain: str, it: Item, rec: dict[str, Any], good: list[dict[str, Any]], rest: list[Item]
) -> tuple[list[dict[str, Any]], Damage]:
    """A record whose seq was already taken: which of the two claims is the insert?"""
    seq = rec["seq"]
    taken = good[seq - 1] if 0 < seq <= len(good) else None
    follows = next((x.record for x in rest if x.record), None)
    if taken is not None and follows is not None and follows.get("prev_hash") == rec["hash"]:
        # The chain goes on from this record, so the one accepted earlier at this seq is the insert.
        return good[: seq - 1], Damage(
            "inserted",
            chain,
            seq,
            "an earlier copy of this seq",
            f"seq {seq} is claimed twice; the chain continues "
            f"from the later one, so the earlier one (hash {taken['hash'][:12]}…) was inserted",
        )
    if taken is not None and taken["hash"] != rec["hash"]:
        return good, Damage("inserted", chain, seq, it.where, f"a second record claiming seq {seq}")
    return good, Damage("reordered", chain, seq, it.where, f"seq {seq} comes after seq {len(good)}")


def _where(items: list[Item], rec: dict[str, Any]) -> Item:
    return next((x for x in items if x.record is rec), Item("?", rec))


def _against_digests(
    digests: list[dict[str, Any]], accepted: dict[str, list[dict[str, Any]]], damaged: set[str]
) -> dict[str, tuple[Damage | None, int]]:
    """Per chain: damage the digests reveal (truncation, a changed head), or how many records are unsealed."""
    last: dict[str, dict[str, Any]] = {}
    out: dict[str, tuple[Damage | None, int]] = {}
    for d in digests:
        params = d.get("params") or {}
        name, head_seq, head_hash = params.get("chain"), params.get("head_seq"), params.get("head_hash")
        if not isinstance(name, str) or not isinstance(head_seq, int) or name in damaged or name in out:
            continue
        recs = accepted.get(name, [])
        where = f"digest seq {d['seq']}"
        if head_seq > len(recs):
            ends = f"seq {len(recs)}" if recs else "no record"
            why = f"the chain ends at {ends}, but digest {d['seq']} names head seq {head_seq}"
            out[name] = (Damage("truncated", name, len(recs) + 1, where, why), 0)
        elif head_seq and recs[head_seq - 1]["hash"] != head_hash:
            out[name] = (Damage("edited", name, head_seq, where, f"seq {head_seq} is not the record digest "
                                f"{d['seq']} sealed"), 0)  # fmt: skip
        last[name] = d
    for name, recs in accepted.items():
        if name == DIGEST_CHAIN or name in out:
            continue
        sealed = last[name]["params"]["head_seq"] if name in last else 0
        out[name] = (None, len(recs) - sealed)
    return out
