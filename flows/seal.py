"""The ``seal-audit-trail`` flow: the scheduled seal of the audit trail (served every
``audit_seal_interval_s`` by ``tpu-ops serve``), so a trail cut off at its end shows within one interval."""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger

from flows.audit import current_actor, trail_for
from flows.settings import resolve_settings


@flow(name="seal-audit-trail", log_prints=True)
def seal_audit_trail(aws_credentials_block: str | None = None) -> dict[str, Any]:
    """Write one KMS-signed digest naming every audit chain's head, even when nothing happened.

    Args:
        aws_credentials_block: Name of a Prefect AwsCredentials block; empty: the environment's credentials.
    """
    settings = resolve_settings(aws_credentials_block)
    trail = trail_for(settings)
    rec = trail.seal(current_actor(trail), interval_s=settings.audit_seal_interval_s or None).record or {}
    heads = rec.get("params", {}).get("heads", {})
    get_run_logger().info("sealed %d chain(s): digest seq %s at %s", len(heads), rec.get("seq"), rec.get("time"))
    return {"seq": rec.get("seq"), "time": rec.get("time"), "chains": len(heads)}
