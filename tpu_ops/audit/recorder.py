"""Recording what a run did, without ever failing the run for it.

    audit = RunAudit(trail, "run-1", actor=...)
    audit.record(AuditEvent.SLICE_PROVISIONED, params={...}, subjects=[...], request_ids=[...])
    with audit.audited(AuditEvent.TRAIN_FINISHED, params={...}) as rec: ...   # success, or failure + error
    audit.digest()   # a KMS-signed digest of the chain head, at the end of each flow run

None of these raises into the caller: a record that cannot reach S3 is spooled locally and sent, in
order, by the next call that can (:class:`tpu_ops.audit.trail.AuditTrail`). The actor is whoever the
``actor`` callable names (a flow adds its flow run and deployment), else the trail's identity.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from tpu_ops.audit.events import AuditEvent
from tpu_ops.audit.records import Actor
from tpu_ops.audit.trail import AuditTrail

log = logging.getLogger("tpu_ops.audit")


def before_start(exc: BaseException) -> bool:
    """True for a failure that proves nothing was done: a credential missing, settings, the spec or the
    budget refused (whatever SDK raised it, seen through ``explain``)."""
    from tpu_ops.cloud.translate import explain
    from tpu_ops.errors import BudgetError, ConfigError, CredentialsError, SpecError

    if not isinstance(exc, Exception):
        return False  # an interrupt or a cancellation may come at any point of a run
    refusals = (CredentialsError, ConfigError, SpecError, BudgetError)
    return isinstance(exc, refusals) or isinstance(explain(exc), refusals)


ActorOf = Callable[[AuditTrail], Actor]


class RunAudit:
    """The audit chain of one run (``chain``: its run id), written through one trail."""

    def __init__(self, trail: AuditTrail, chain: str, actor: ActorOf | None = None) -> None:
        self.trail, self.chain, self._actor = trail, chain, actor
        self._refused = False  # a failure before the run began was printed, not kept: so is the seal

    def actor(self) -> Actor:
        return self._actor(self.trail) if self._actor else self.trail.actor()

    def record(
        self,
        event: AuditEvent,
        *,
        params: dict[str, Any] | None = None,
        outcome: str = "success",
        subjects: list[dict[str, Any]] | None = None,
        request_ids: list[str] | None = None,
        links: list[dict[str, Any]] | None = None,
        error: str | None = None,
        before_start: bool = False,
    ) -> dict[str, Any] | None:
        """Append one record to the chain; returns it, or None if spooled or failed (never raises).

        ``before_start``: a failure before the run began (nothing was done). If the trail does not take
        it and no record of the run was kept before, it is printed, not spooled: the spool would push a
        record of a run that never existed into the trail of the next command's environment.
        """
        spool = not before_start or self.trail.began(self.chain)
        try:
            written = self.trail.record(
                self.chain, event.value, self.actor(), params=params, outcome=outcome, subjects=subjects,
                request_ids=request_ids, links=links, error=error, spool=spool,
            )  # fmt: skip
            if written.spooled:
                log.warning("audit: %s for run %s spooled to %s (S3 unreachable, or an earlier record of the run "
                            "waits there)", event.value, self.chain, self.trail.spool.path)  # fmt: skip
            elif written.record is None:
                self._not_kept(event, outcome, error, "the trail is unreachable")
            return written.record
        except Exception as exc:
            if spool:
                log.warning("audit: could not record %s for run %s: %s", event.value, self.chain, exc)
            else:
                self._not_kept(event, outcome, error, f"the trail refused it: {exc}")
            return None

    def _not_kept(self, event: AuditEvent, outcome: str, error: str | None, why: str) -> None:
        self._refused = True
        log.warning("audit: %s (%s%s) for run %s not recorded and not spooled: the run never began, and %s",
                    event.value, outcome, f": {error}" if error else "", self.chain, why)  # fmt: skip

    @contextmanager
    def audited(self, event: AuditEvent, *, params: dict[str, Any] | None = None) -> Iterator[dict[str, Any]]:
        """Audit the block as ``event``: success, or failure with the error (re-raised). The block may
        add ``params``, ``subjects`` and ``request_ids`` to the dict it is given."""
        extra: dict[str, Any] = {"params": dict(params or {}), "subjects": [], "request_ids": []}
        try:
            yield extra
        except BaseException as exc:
            self.record(event, outcome="failure", error=f"{type(exc).__name__}: {exc}",
                        before_start=before_start(exc), **extra)  # fmt: skip
            raise
        self.record(event, **extra)

    def digest(self) -> dict[str, Any] | None:
        """Seal the chain's head with a signed digest (spooled if S3 is down; never raises)."""
        try:
            written = self.trail.digest(
                self.chain, self.actor(), spool=not self._refused or self.trail.began(self.chain)
            )
            if written.spooled:
                log.warning("audit: S3 unreachable, digest of run %s spooled", self.chain)
            return written.record
        except Exception as exc:
            log.warning("audit: could not seal run %s: %s", self.chain, exc)
            return None
