"""Telemetry off by default: nothing tpu-ops starts phones home unless the user turns it on.

Prefect has two channels, both off here unless the environment already says otherwise:

- the server's heartbeat to ``https://sens-o-matic.prefect.io/`` every 10 minutes (every server,
  the temporary one a command starts included): ``PREFECT_SERVER_ANALYTICS_ENABLED``;
- the client SDK's usage events (first import, first flow run, in an interactive terminal): the
  ``DO_NOT_TRACK`` convention, and the server setting above.

Setting ``PREFECT_SERVER_ANALYTICS_ENABLED=true`` in the environment is the explicit opt-in: then
neither is touched (docs/privacy.md).
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

ANALYTICS = "PREFECT_SERVER_ANALYTICS_ENABLED"
DO_NOT_TRACK = "DO_NOT_TRACK"


def telemetry_off(environ: MutableMapping[str, str] | None = None) -> bool:
    """Turn Prefect's telemetry off in ``environ`` (the process environment, inherited by every server,
    worker and flow process tpu-ops starts) unless the user set ``PREFECT_SERVER_ANALYTICS_ENABLED``
    themselves. Returns whether telemetry is off."""
    env = os.environ if environ is None else environ
    chosen = env.get(ANALYTICS)
    if chosen is not None and chosen.strip().lower() in ("1", "true", "yes", "on"):
        return False  # the user's explicit choice
    env[ANALYTICS] = "false"
    env.setdefault(DO_NOT_TRACK, "1")
    return True
