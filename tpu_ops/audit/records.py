"""Audit records: canonical JSON, the hash chain, redaction of secrets.

A record is a JSON object. Its ``hash`` is the SHA-256 of its canonical form (sorted keys, no
spaces, UTF-8) without the ``hash`` field, and its ``prev_hash`` is the hash of the record before it
in the same chain (``GENESIS`` for seq 1), so editing, deleting, inserting or reordering a record
breaks a link that :mod:`tpu_ops.audit.verify` names. Digest records (chain ``_digests``) also
carry a KMS signature over their canonical form without ``hash`` and ``signature``.
"""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr

from tpu_ops.audit.events import AuditEvent

GENESIS = "0" * 64
FORMAT = 1
DIGEST_CHAIN = "_digests"
DIGEST_EVENT = AuditEvent.AUDIT_DIGEST.value
SEAL_EVENT = AuditEvent.AUDIT_SEAL.value
QUARANTINE_CHAIN = "_trail"  # events about the trail itself: quarantined spool lines, foreign objects
OUTCOMES = ("success", "failure", "refused", "started")
_CHAIN = re.compile(r"^(_digests|_trail|[a-z][-a-z0-9]{0,62})$")
# Parameter names whose values never reach a record, and values that look like credentials.
_SECRET_NAME = re.compile(
    r"(passw|secret|token|credential|private[_-]?key|access[_-]?key|api[_-]?key|authori[sz]ation|session)", re.I
)
_SECRET_VALUE = re.compile(r"(-----BEGIN [A-Z ]*PRIVATE KEY|\b(AKIA|ASIA)[0-9A-Z]{16}\b|\"private_key\"\s*:)")
REDACTED = "[redacted]"


def canonical(obj: Any) -> bytes:
    """The canonical JSON bytes of ``obj``: sorted keys, no whitespace, UTF-8, no NaN."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def record_hash(record: dict[str, Any]) -> str:
    """SHA-256 (hex) of ``record``'s canonical form without its ``hash`` field."""
    body = {k: v for k, v in record.items() if k != "hash"}
    return hashlib.sha256(canonical(body)).hexdigest()


def signed_bytes(record: dict[str, Any]) -> bytes:
    """What a digest's signature covers: its canonical form without ``hash`` and ``signature``."""
    return canonical({k: v for k, v in record.items() if k not in ("hash", "signature")})


def check_chain(name: str) -> str:
    """``name`` if it can name a chain (a run id, or ``_digests``), else ``ValueError``."""
    if not _CHAIN.fullmatch(name):
        raise ValueError(
            f"audit chain {name!r} is not a run id ([a-z][-a-z0-9]*, ≤ 63), {DIGEST_CHAIN!r} or {QUARANTINE_CHAIN!r}"
        )
    return name


def redact(params: Any, path: str = "") -> tuple[Any, list[str]]:
    """``params`` with secrets replaced by ``[redacted]``, and the paths that were redacted.

    A value is redacted when its name looks like a credential (``password``, ``secret_access_key``,
    ``token``...), when it is a ``SecretStr``, or when it looks like one (a PEM private key, an AWS
    access key id, a service-account key document).
    """
    if isinstance(params, SecretStr):
        return REDACTED, [path or "."]
    if isinstance(params, dict):
        out: dict[str, Any] = {}
        hits: list[str] = []
        for key, value in params.items():
            sub = f"{path}.{key}" if path else str(key)
            if _SECRET_NAME.search(str(key)) and value not in (None, "", [], {}) and not _is_block_name(key):
                out[str(key)] = REDACTED
                hits.append(sub)
                continue
            out[str(key)], more = redact(value, sub)
            hits += more
        return out, hits
    if isinstance(params, list | tuple):
        items = [redact(v, f"{path}[{i}]") for i, v in enumerate(params)]
        return [v for v, _ in items], [h for _, hs in items for h in hs]
    if isinstance(params, str) and _SECRET_VALUE.search(params):
        return REDACTED, [path or "."]
    if params is None or isinstance(params, bool | int | float | str):
        return params, []
    return str(params), []


def _is_block_name(key: Any) -> bool:
    # ``aws_credentials_block`` names a Prefect block; the name is not a secret and is worth keeping.
    return str(key).endswith("_block")


class Subject(BaseModel):
    """Something an event touched: an object, a checkpoint, a model package, an endpoint."""

    model_config = ConfigDict(extra="forbid")

    uri: str
    kind: str | None = None
    sha256: str | None = None
    crc32c: str | None = None
    size: int | None = Field(None, ge=0)
    version: str | None = None


class Link(BaseModel):
    """A pointer to an earlier record, by chain, seq and hash."""

    model_config = ConfigDict(extra="forbid")

    chain: str
    seq: int = Field(ge=1)
    hash: str


class Actor(BaseModel):
    """Who acted: a user or service identity, and the Prefect flow run and deployment, if any."""

    model_config = ConfigDict(extra="forbid")

    identity: str
    flow: str | None = None
    flow_run: str | None = None
    deployment: str | None = None


def new_event(
    chain: str,
    event: str,
    actor: Actor,
    *,
    params: dict[str, Any] | None = None,
    outcome: str = "success",
    error: str | None = None,
    request_ids: list[str] | None = None,
    subjects: list[Subject | dict[str, Any]] | None = None,
    links: list[Link | dict[str, Any]] | None = None,
    now: datetime | None = None,
) -> dict[str, Any]:
    """An unsealed event (no ``seq``/``prev_hash``/``hash`` yet): what the spool holds."""
    if outcome not in OUTCOMES:
        raise ValueError(f"outcome {outcome!r} is not one of {', '.join(OUTCOMES)}")
    if not re.fullmatch(r"[a-z][a-z0-9_.-]{0,79}", event):
        raise ValueError(f"event name {event!r} is not allowed: lowercase dotted name like 'model.exported'")
    clean, redacted = redact(params or {})
    body: dict[str, Any] = {
        "v": FORMAT,
        "id": uuid.uuid4().hex,
        "chain": check_chain(chain),
        "time": (now or datetime.now(UTC)).isoformat(timespec="microseconds"),
        "event": event,
        "actor": actor.model_dump(exclude_none=True),
        "params": clean,
        "outcome": outcome,
        "request_ids": [str(r) for r in request_ids or []],
        "subjects": [Subject.model_validate(s).model_dump(exclude_none=True) for s in subjects or []],
        "links": [Link.model_validate(x).model_dump() for x in links or []],
    }
    if redacted:
        body["redacted"] = redacted
    if error:
        body["error"] = error[:2000]
    return body


def seal(event: dict[str, Any], seq: int, prev_hash: str) -> dict[str, Any]:
    """The record of ``event`` at ``seq`` after ``prev_hash``, with its ``hash``."""
    record = {**{k: v for k, v in event.items() if k not in ("seq", "prev_hash", "hash")}}
    record["seq"] = seq
    record["prev_hash"] = prev_hash
    record["hash"] = record_hash(record)
    return record


def link_to(record: dict[str, Any]) -> Link:
    """A link to a sealed ``record``."""
    return Link(chain=record["chain"], seq=record["seq"], hash=record["hash"])
