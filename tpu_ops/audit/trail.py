"""Writing the audit trail: append a record to a chain, spool while S3 is down, seal runs with digests.

    trail = AuditTrail.from_settings(settings)
    rec = trail.record("run-1", "model.exported", actor, params={...}, subjects=[...])
    trail.digest("run-1")      # a KMS-signed digest of the chain head, in the global digest chain

Ordering under concurrent writers: within a chain, seq N is whoever created ``.../<N>.json``
first (a conditional create); the loser re-reads the head and appends after the winner. The
global ``_digests`` chain is ordered the same way, each digest naming the previous digest's hash.
"""

from __future__ import annotations

import base64
import getpass
import logging
import threading
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from tpu_ops.audit.events import AuditEvent
from tpu_ops.audit.records import (
    DIGEST_CHAIN,
    DIGEST_EVENT,
    QUARANTINE_CHAIN,
    SEAL_EVENT,
    Actor,
    link_to,
    new_event,
    seal,
)
from tpu_ops.audit.signing import SIGNING_ALGORITHM, signed_message, verify_signature
from tpu_ops.audit.spool import Drained, Spool
from tpu_ops.audit.store import CLAIM_ATTEMPTS, Conflict, Head, S3Store, is_unreachable
from tpu_ops.cloud.clients import Clients
from tpu_ops.errors import ConfigError, IntegrityError
from tpu_ops.settings import Settings
from tpu_ops.uris import parse_s3

log = logging.getLogger("tpu_ops.audit")


@dataclass(frozen=True)
class Written:
    """What ``record``/``digest`` did: the sealed record, or ``None`` with ``spooled=True``."""

    record: dict[str, Any] | None
    spooled: bool = False
    flushed: int = 0


def audit_clients(source: Settings | Clients) -> tuple[Any, Any]:
    """S3 and KMS clients for the trail: short timeouts and few retries, since a failure just spools."""
    clients = source if isinstance(source, Clients) else Clients(source)
    kw: dict[str, Any] = {"max_attempts": 2, "connect_timeout": 2, "read_timeout": 10}
    return clients.aws("s3", max_pool_connections=16, **kw), clients.aws("kms", **kw)


def os_user() -> str:
    """``user:<login>``: who writes records when the settings name no ``audit_actor``."""
    try:
        return f"user:{getpass.getuser()}"
    except Exception:
        return "tpu-ops"


class AuditTrail:
    """Appends records to chains in S3 (write-once), spooling while S3 is unreachable."""

    def __init__(self, store: S3Store, kms: Any, spool: Spool, key_id: str | None, identity: str) -> None:
        self.store = store
        self.kms = kms
        self.spool = spool
        self.key_id = key_id
        self.identity = identity
        self._heads: dict[str, Head] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_settings(cls, settings: Settings) -> AuditTrail:
        return cls.of(Clients(settings))

    @classmethod
    def of(cls, clients: Clients) -> AuditTrail:
        """The trail written with ``clients``' credentials (a run's, so all its records carry them)."""
        s = clients.settings
        s3, kms = audit_clients(clients)
        store = S3Store(s3, parse_s3(s.audit_uri), s.audit_retention_days)
        return cls(store, kms, Spool(s.audit_spool_path), s.audit_kms_key_id, s.audit_actor or os_user())

    def actor(self, **flow: str | None) -> Actor:
        """An actor naming this trail's identity and the given flow / flow_run / deployment."""
        return Actor(identity=self.identity, **flow)

    # -- writing -------------------------------------------------------------------------------
    def record(
        self, chain: str, event: str, actor: Actor | None = None, *, spool: bool = True, **fields: Any
    ) -> Written:
        """Append one event to ``chain``; spools it instead if S3 is unreachable (never loses it).

        ``fields`` are those of :func:`tpu_ops.audit.records.new_event` (params, outcome, error,
        request_ids, subjects, links). Secrets in ``params`` are redacted. ``spool=False``: an event
        of a run that never began (refused before its first cloud call) is not kept when S3 does not
        take it, since the spool would carry it into whatever trail the next command writes to.
        """
        body = new_event(chain, event, actor or self.actor(), **fields)
        return self._submit({"kind": "record", "event": body}, spool)

    def digest(self, chain: str, actor: Actor | None = None, *, spool: bool = True) -> Written:
        """Seal ``chain``'s current head with a KMS-signed digest in the global digest chain."""
        if not self.key_id:
            raise ConfigError("no audit KMS key: set TPU_OPS_AUDIT_KMS_KEY_ID (the local stack creates one)")
        body = new_event(DIGEST_CHAIN, DIGEST_EVENT, actor or self.actor(), params={"chain": chain})
        return self._submit({"kind": "digest", "event": body}, spool)

    def began(self, chain: str) -> bool:
        """True if ``chain`` is known to have begun: this trail wrote to it, or the spool keeps a record of it."""
        return chain in self._heads or self.spool.holds(chain)

    def seal(
        self,
        actor: Actor | None = None,
        *,
        interval_s: int | None = None,
        now: datetime | None = None,
        bundle: bool = True,
    ) -> Written:
        """The scheduled seal: one KMS-signed digest naming every chain's head, written even when nothing
        happened, so a trail cut off at its end shows within one interval (``tpu-ops audit seal``).

        With ``bundle``, each chain's records since its last bundle are copied into a locked bundle the
        seal names by sha256, so verify reads a chain in one GET instead of one per record.

        Never spooled: a seal S3 did not take is a gap in the schedule, and verify says so.
        """
        if not self.key_id:
            raise ConfigError("no audit KMS key: set TPU_OPS_AUDIT_KMS_KEY_ID (the local stack creates one)")
        with self._lock:
            self._drain()  # spooled records first, so the seal names them
            heads: dict[str, dict[str, Any]] = {}
            bundles: list[dict[str, Any]] = []
            for chain in sorted(c for c in self.store.chains() if c != DIGEST_CHAIN):
                head = self.store.head(chain, self._heads.get(chain))
                self._heads[chain] = head
                if head.sealed_seq:
                    heads[chain] = {"seq": head.sealed_seq, "hash": head.hash}
                    if bundle and (ref := self.store.write_bundle(chain, head.sealed_seq)):
                        bundles.append(ref)
            params = {"interval_s": interval_s, "heads": heads, "bundles": bundles}
            body = new_event(DIGEST_CHAIN, SEAL_EVENT, actor or self.actor(), params=params, now=now)
            return Written(self._send({"kind": "seal", "event": body}))

    def flush(self) -> int:
        """Send what the spool holds, in order; returns how many went (raises if S3 is still down)."""
        return self.drain().sent

    def drain(self) -> Drained:
        """Send what the spool holds: how many went, which lines were quarantined, which chains are held back."""
        with self._lock:
            return self._drain()

    def _drain(self) -> Drained:
        drained = self.spool.drain(self._send, is_unreachable)
        for q in drained.quarantined:
            log.warning("audit spool %s: line %d (%d bytes) is not an entry; moved to %s", self.spool.path, q.line,
                        q.size, self.spool.quarantine_path)  # fmt: skip
            params = {"spool": str(self.spool.path), "quarantine": str(self.spool.quarantine_path), "line": q.line,
                      "bytes": q.size, "sha256": q.sha256}  # fmt: skip
            note = new_event(
                QUARANTINE_CHAIN, AuditEvent.AUDIT_SPOOL_QUARANTINED, self.actor(), params=params, outcome="failure"
            )
            try:
                self._send({"kind": "record", "event": note})
            except Exception as exc:
                if not is_unreachable(exc):
                    raise
                self.spool.append({"kind": "record", "event": note})
        for chain, why in drained.stuck.items():
            log.warning("audit chain %s: a spooled record cannot be sent (%s); its later records wait", chain, why)
        return drained

    def _submit(self, entry: dict[str, Any], spool: bool = True) -> Written:
        with self._lock:
            chain = entry["event"]["chain"]
            try:
                drained = self._drain()
                if chain in drained.stuck:  # behind its chain's stuck record, in order; other chains go on
                    self.spool.append(entry)
                    return Written(None, spooled=True, flushed=drained.sent)
                record = self._send(entry)
            except Exception as exc:
                # A record is spooled whatever failed, so it is never lost (unreachable S3 is
                # expected; anything else is raised too, for the caller to see). A digest that
                # failed for another reason (a KMS key refused) is not kept: it would block its chain.
                unreachable = is_unreachable(exc)
                if spool and (unreachable or entry["kind"] == "record"):
                    self.spool.append(entry)
                if not unreachable:
                    raise
                return Written(None, spooled=spool)
            return Written(record, flushed=drained.sent)

    def _send(self, entry: dict[str, Any]) -> dict[str, Any]:
        event = entry["event"]
        chain = event["chain"]
        head = self._heads.get(chain) or self.store.head(chain)
        if head.event_id == event["id"]:  # a drain that died after the put: already there
            return self.store.get(self.store.key(chain, head.sealed_seq))
        for _ in range(CLAIM_ATTEMPTS):
            try:
                if head.skipped and chain != DIGEST_CHAIN:
                    head = self._note_foreign(chain, head)
                if entry["kind"] == "digest":
                    record = self._sealed_digest(event, head)
                elif entry["kind"] == "seal":  # names every chain: over KMS's 4 KiB RAW limit, so sign its SHA-256
                    record = self._signed(dict(event), head, "DIGEST")
                else:
                    record = seal(event, head.seq + 1, head.hash)
                self.store.put_new(record)
            except Conflict:
                head = self.store.head(chain, head)
                if head.event_id == event["id"]:
                    return self.store.get(self.store.key(chain, head.sealed_seq))
                continue
            self._heads[chain] = Head(record["seq"], record["hash"], event["id"])
            return record
        raise IntegrityError(f"audit chain {chain}: could not claim a seq in {CLAIM_ATTEMPTS} attempts")

    def _note_foreign(self, chain: str, head: Head) -> Head:
        """Audit the foreign objects at the head of ``chain`` (they keep their seqs); the new head."""
        objects = [{"key": f.key, "seq": f.seq, "sha256": f.sha256, "size": f.size, "problem": f.problem[:300]}
                   for f in head.skipped]  # fmt: skip
        log.warning("audit chain %s: %d foreign object(s) at its head, passed over: %s", chain, len(objects),
                    ", ".join(f.key for f in head.skipped))  # fmt: skip
        note = new_event(
            chain, AuditEvent.AUDIT_FOREIGN_OBJECT, self.actor(), params={"objects": objects}, outcome="failure"
        )
        record = seal(note, head.seq + 1, head.hash)
        self.store.put_new(record)
        return Head(record["seq"], record["hash"], note["id"])

    def _key_arn(self) -> str:
        # Records name the key by ARN, whatever alias the settings used, so verify can pin it.
        if self.key_id and not self.key_id.startswith("arn:"):
            self.key_id = str(self.kms.describe_key(KeyId=self.key_id)["KeyMetadata"]["Arn"])
        return str(self.key_id)

    def _sealed_digest(self, event: dict[str, Any], head: Head) -> dict[str, Any]:
        chain = event["params"]["chain"]
        target = self.store.head(chain, self._heads.get(chain))
        self._heads[chain] = target
        body = dict(event)
        body["params"] = {"chain": chain, "head_seq": target.sealed_seq, "head_hash": target.hash}
        if target.sealed_seq:
            body["links"] = [{"chain": chain, "seq": target.sealed_seq, "hash": target.hash}]
        return self._signed(body, head)

    def _signed(self, body: dict[str, Any], head: Head, message_type: str = "RAW") -> dict[str, Any]:
        body["key_id"] = self._key_arn()
        body["signing_algorithm"] = SIGNING_ALGORITHM
        if message_type != "RAW":
            body["message_type"] = message_type
        unsigned = seal(body, head.seq + 1, head.hash)
        resp = self.kms.sign(
            KeyId=body["key_id"], Message=signed_message(unsigned), MessageType=message_type,
            SigningAlgorithm=SIGNING_ALGORITHM,
        )  # fmt: skip
        body["signature"] = base64.b64encode(resp["Signature"]).decode()
        return seal(body, head.seq + 1, head.hash)


__all__ = ["SIGNING_ALGORITHM", "AuditTrail", "Written", "audit_clients", "link_to", "verify_signature"]
