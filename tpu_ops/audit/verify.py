"""Verify an audit trail (an ``s3://`` trail prefix or a JSONL file) and name the damage.

Kinds of damage, as ``validate-logs`` names them for CloudTrail, and more:

- ``malformed``: a stored record that cannot be read as one: not UTF-8, not JSON, NaN/Infinity,
  a duplicate key, too large or too deeply nested, not an object, or without seq/hash/chain;
- ``foreign``: an object under a chain whose key is not a record key (``<seq:012d>.json``);
- ``edited``: a record's content no longer matches its hash, or its hash was recomputed so the
  next record's ``prev_hash`` no longer matches it (or the record a digest names has changed);
- ``deleted``: a seq is missing in the middle of a chain;
- ``reordered``: records out of seq order (in S3: a record stored under another seq's key);
- ``inserted``: a record the chain does not continue from (a second claim on a seq, or a record
  whose ``prev_hash`` names an earlier record that already has a successor);
- ``truncated``: a chain ends before the head its last digest names;
- ``forged-digest``: a digest whose KMS signature does not verify, or signed by another key than
  the one pinned;
- ``stale``: the newest digest is older than the sealing interval allows: the newest records and
  digests may have been cut off;
- ``gap``: two scheduled seals further apart than the interval allows;
- ``history``: in S3, a non-current version or a delete marker under the trail (a write-once
  trail has neither).

Which record is blamed when a ``prev_hash`` does not match its predecessor: the digests decide. If
a verified digest sealed the predecessor with exactly its hash, the successor is wrong; if one
sealed a later head the successor links to, the predecessor is. Malformed and foreign objects are
reported but do not stop the walk, so one planted object never hides the rest of a chain.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from tpu_ops.audit.reading import (
    Item,
    item_from_object,
    items_from_jsonl,
    items_from_objects,
    parse_record,
    parse_time,
    time_of,
)
from tpu_ops.audit.records import DIGEST_CHAIN, GENESIS, SEAL_EVENT, record_hash

__all__ = ["KINDS", "Damage", "Item", "Report", "item_from_object", "items_from_jsonl", "items_from_objects",
           "parse_record", "parse_time", "verify"]  # fmt: skip

KINDS = ("malformed", "foreign", "edited", "deleted", "reordered", "inserted", "truncated", "forged-digest",
         "stale", "gap", "history")  # fmt: skip


@dataclass(frozen=True)
class Damage:
    """A bad record (or object) of one chain and what is wrong with it."""

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

    records: int = 0  # every item read, digests and unreadable ones included
    chains: int = 0
    digests: int = 0
    # records per run chain (the digest chain not among them): what lineage and the run page count too
    chain_records: dict[str, int] = field(default_factory=dict)
    signatures_checked: bool = False
    damage: list[Damage] = field(default_factory=list)
    unsealed: dict[str, int] = field(default_factory=dict)
    newest_digest: dict[str, Any] | None = None
    newest_digest_age_s: float | None = None
    seal_interval_s: int | None = None

    @property
    def ok(self) -> bool:
        return not self.damage

    def counts(self) -> str:
        """``N records in C chains, and D digests``: the words verify and the run page share."""
        n = sum(self.chain_records.values())
        return (f"{n} record{'s' * (n != 1)} in {self.chains} chain{'s' * (self.chains != 1)}, "
                f"and {self.digests} digest{'s' * (self.digests != 1)}")  # fmt: skip

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}


# -- the walk ---------------------------------------------------------------------------------------
Sealed = dict[str, dict[int, tuple[str, int]]]  # chain -> seq -> (hash, digest seq that sealed it)


def verify(
    items: list[Item],
    kms: Any = None,
    trusted_key: str | None = None,
    *,
    now: datetime | None = None,
    seal_interval_s: int | None = None,
    history: Iterable[Damage] = (),
) -> Report:
    """Check every chain and the digest chain.

    Digest signatures are checked only against ``trusted_key`` (a pinned key ARN), through ``kms``;
    without both, ``signatures_checked`` is False. A KMS that cannot answer raises its
    ``CloudError`` (it is not damage). ``seal_interval_s`` turns on the schedule check (``stale``,
    ``gap``) at ``now``; ``history`` is damage found in S3's version listing.
    """
    chains: dict[str, list[Item]] = {}
    report = Report(records=len(items), signatures_checked=kms is not None and bool(trusted_key))
    report.damage.extend(history)
    for it in items:
        rec = it.record
        name = rec.get("chain") if rec else it.key_chain
        chains.setdefault(str(name or it.key_chain or "?"), []).append(it)
    report.chain_records = {c: len(its) for c, its in chains.items() if c != DIGEST_CHAIN}
    report.chains = len(report.chain_records)
    sig = _signature_check(kms, trusted_key) if report.signatures_checked else None
    digests, damage = _walk(DIGEST_CHAIN, chains.get(DIGEST_CHAIN, []), {}, sig)
    report.damage.extend(damage)
    report.digests = len(digests)
    sealed = _sealed(digests)
    accepted: dict[str, list[dict[str, Any]]] = {}
    fatal: set[str] = set()
    for name in sorted(c for c in chains if c != DIGEST_CHAIN):
        good, damage = _walk(name, chains[name], sealed.get(name, {}), None)
        accepted[name] = good
        report.damage.extend(damage)
        if any(d.kind not in ("malformed", "foreign") for d in damage):
            fatal.add(name)
    for name, (bad, unsealed) in _against_digests(digests, accepted, fatal).items():
        if bad:
            report.damage.append(bad)
        elif unsealed:
            report.unsealed[name] = unsealed
    if seal_interval_s:
        _schedule(report, digests, items, now or datetime.now(UTC), seal_interval_s)
    return report


def _signature_check(kms: Any, trusted_key: str | None) -> Callable[[dict[str, Any]], str | None]:
    from tpu_ops.audit.signing import verify_signature

    def check(rec: dict[str, Any]) -> str | None:
        if rec.get("key_id") != trusted_key:
            return f"signed by {rec.get('key_id')!r}, not the pinned key {trusted_key!r}"
        if not verify_signature(kms, rec, trusted_key):
            return "its KMS signature does not verify"
        return None

    return check


def _heads_named(d: dict[str, Any]) -> list[tuple[Any, Any, Any]]:
    """(chain, head seq, head hash) a digest names: one for a run's digest, every chain for a seal."""
    params = d.get("params") or {}
    if isinstance(params.get("heads"), dict):
        return [(c, (h or {}).get("seq"), (h or {}).get("hash")) for c, h in params["heads"].items()
                if isinstance(h, dict)]  # fmt: skip
    return [(params.get("chain"), params.get("head_seq"), params.get("head_hash"))]


def _sealed(digests: list[dict[str, Any]]) -> Sealed:
    out: Sealed = {}
    for d in digests:
        for chain, seq, h in _heads_named(d):
            if isinstance(chain, str) and isinstance(seq, int) and isinstance(h, str):
                out.setdefault(chain, {})[seq] = (h, d["seq"])
    return out


def _walk(
    chain: str,
    items: list[Item],
    sealed: dict[int, tuple[str, int]],
    sig: Callable[[dict[str, Any]], str | None] | None,
) -> tuple[list[dict[str, Any]], list[Damage]]:
    """Accept records in order until the first damage; returns what was accepted and the damage found.

    Malformed and foreign objects are damage too, but the walk goes on past them.
    """
    good: list[dict[str, Any]] = []
    found: list[Damage] = []
    prev_hash: str | None = GENESIS  # None: the predecessor was unreadable, any prev_hash is taken
    skipped = 0  # seqs taken by unreadable objects

    def stop(kind: str, it: Item, seq: int | None, detail: str) -> tuple[list[dict[str, Any]], list[Damage]]:
        return good, [*found, Damage(kind, chain, seq, it.where, detail)]

    for i, it in enumerate(items):
        rec = it.record
        expected = len(good) + skipped + 1
        if it.foreign:
            found.append(Damage("foreign", chain, None, it.where, it.problem or "not a record"))
            continue
        if rec is None:
            found.append(Damage("malformed", chain, it.key_seq, it.where, it.problem or "not a record"))
            if it.key_seq == expected:
                skipped += 1
                prev_hash = None
            continue
        if rec.get("hash") != record_hash(rec):
            return stop("edited", it, rec["seq"], "its content does not match its hash")
        seq = rec["seq"]
        if it.key_chain is not None and it.key_chain != chain:
            return stop("inserted", it, seq, f"a record of chain {chain} stored in chain {it.key_chain}")
        if it.key_seq is not None and it.key_seq != seq:
            return stop("reordered", it, seq, f"stored under seq {it.key_seq}'s key")
        if sig and (why := sig(rec)):
            return stop("forged-digest", it, seq, why)
        rest = items[i + 1 :]
        if seq == expected and (prev_hash is None or rec.get("prev_hash") == prev_hash):
            good.append(rec)
            prev_hash = rec["hash"]
            continue
        if seq == expected:
            if prev_hash is not None and any(x.record and x.record.get("prev_hash") == prev_hash for x in rest):
                return stop("inserted", it, seq, f"the chain continues from seq {expected - 1}, not from this record")
            if not good:
                return stop("edited", it, seq, "its prev_hash is not the chain's genesis")
            return good, [*found, _blame(chain, items, good, it, rest, sealed)]
        if seq > expected:
            if any(x.record and x.record.get("seq") == expected for x in rest):
                return stop("reordered", it, seq, f"seq {seq} comes before seq {expected}")
            missing = f"seq {expected}" if seq == expected + 1 else f"seqs {expected}-{seq - 1}"
            return stop("deleted", it, expected, f"{missing} missing before this record")
        kept, damage = _older_seq(chain, it, rec, good, rest)
        return kept, [*found, damage]
    return good, found


def _blame(
    chain: str, items: list[Item], good: list[dict[str, Any]], it: Item, rest: list[Item],
    sealed: dict[int, tuple[str, int]],
) -> Damage:  # fmt: skip
    """Seq N+1's prev_hash is not seq N's hash: which of the two is wrong? The digests say."""
    prev, rec = good[-1], it.record or {}
    n = prev["seq"]
    if n in sealed and sealed[n][0] == prev["hash"]:
        kind = "edited" if any(x.record for x in rest) else "inserted"
        return Damage(kind, chain, rec.get("seq"), it.where,
                      f"its prev_hash is not the hash of seq {n}, which digest {sealed[n][1]} sealed")  # fmt: skip
    link, h = rec, rec.get("seq", 0)
    for x in [it, *rest]:
        if x is not it:
            if not x.record or x.record.get("seq") != h + 1 or x.record.get("prev_hash") != link.get("hash"):
                break
            link, h = x.record, h + 1
        if h in sealed and sealed[h][0] == link.get("hash"):
            return Damage("edited", chain, n, _where(items, prev).where,
                          f"its hash no longer matches the prev_hash of seq {n + 1}, and digest {sealed[h][1]} "
                          f"sealed seq {h}, which links back to seq {n + 1}")  # fmt: skip
    return Damage("edited", chain, n, _where(items, prev).where,
                  f"its hash no longer matches the prev_hash of seq {n + 1} (or seq {n + 1}'s prev_hash was "
                  "changed: no digest says which)")  # fmt: skip


def _older_seq(
    chain: str, it: Item, rec: dict[str, Any], good: list[dict[str, Any]], rest: list[Item]
) -> tuple[list[dict[str, Any]], Damage]:
    """A record whose seq was already taken: which of the two claims is the insert?"""
    seq = rec["seq"]
    taken = next((g for g in good if g["seq"] == seq), None)
    follows = next((x.record for x in rest if x.record), None)
    if taken is not None and follows is not None and follows.get("prev_hash") == rec["hash"]:
        # The chain goes on from this record, so the one accepted earlier at this seq is the insert.
        return [g for g in good if g["seq"] < seq], Damage(
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
    last: dict[str, int] = {}
    out: dict[str, tuple[Damage | None, int]] = {}
    for d in digests:
        for name, head_seq, head_hash in _heads_named(d):
            if not isinstance(name, str) or not isinstance(head_seq, int) or name in damaged or name in out:
                continue
            by_seq = {r["seq"]: r for r in accepted.get(name, [])}
            top = max(by_seq, default=0)
            where = f"digest seq {d['seq']}"
            if head_seq > top:
                ends = f"seq {top}" if by_seq else "no record"
                why = f"the chain ends at {ends}, but digest {d['seq']} names head seq {head_seq}"
                out[name] = (Damage("truncated", name, top + 1, where, why), 0)
            elif head_seq and (head_seq not in by_seq or by_seq[head_seq]["hash"] != head_hash):
                out[name] = (Damage("edited", name, head_seq, where, f"seq {head_seq} is not the record digest "
                                    f"{d['seq']} sealed"), 0)  # fmt: skip
            last[name] = head_seq
    for name, recs in accepted.items():
        if name in out:
            continue
        top = max((r["seq"] for r in recs), default=0)
        out[name] = (None, top - last.get(name, 0))
    return out


def _schedule(report: Report, digests: list[dict[str, Any]], items: list[Item], now: datetime, interval: int) -> None:
    """``stale`` if the newest digest is older than the interval allows; ``gap`` between scheduled seals."""
    grace = interval / 10  # a scheduler starts a little late; a cut-off still shows within one interval
    report.seal_interval_s = interval
    times = [(t, d) for d in digests if (t := time_of(d)) is not None]
    if times:
        newest, d = max(times, key=lambda t: t[0])
        age = (now - newest).total_seconds()
        report.newest_digest = {"seq": d["seq"], "time": d["time"], "event": d.get("event")}
        report.newest_digest_age_s = age
        if age > interval + grace:
            why = (f"the newest digest ({d['time']}) is {age:.0f} s old, but seals are due every {interval} s: "
                   "records and digests after it may have been cut off")  # fmt: skip
            report.damage.append(Damage("stale", DIGEST_CHAIN, d["seq"], f"digest seq {d['seq']}", why))
    elif stamps := [t for it in items if it.record and (t := time_of(it.record)) is not None]:
        oldest = min(stamps)
        if (now - oldest).total_seconds() > interval + grace:
            why = f"records since {oldest.isoformat()} but no digest: seals are due every {interval} s"
            report.damage.append(Damage("stale", DIGEST_CHAIN, None, "no digest", why))
    seals = [(t, d) for t, d in times if d.get("event") == SEAL_EVENT]
    for (t0, _), (t1, d) in itertools.pairwise(seals):
        if (t1 - t0).total_seconds() > interval + grace:
            why = (
                f"{(t1 - t0).total_seconds():.0f} s after the previous seal ({t0.isoformat()}); due every {interval} s"
            )
            report.damage.append(Damage("gap", DIGEST_CHAIN, d["seq"], f"digest seq {d['seq']}", why))
