"""The fakes' clocks live in :mod:`infra.local.core.clock`; kept so existing imports keep working."""

from infra.local.core.clock import Clock, ManualClock, SystemClock, parse_proto_duration, parse_rfc3339, rfc3339

__all__ = ["Clock", "ManualClock", "SystemClock", "parse_proto_duration", "parse_rfc3339", "rfc3339"]
