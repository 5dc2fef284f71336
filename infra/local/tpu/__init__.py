"""A fake of the Cloud TPU v2 REST API, built like a moto service.

``exceptions`` (Google's error model), ``models`` (the state machine, usable in-process),
``capacity`` (per-zone chips and reservations), ``responses`` (HTTP only), ``urls`` (routing),
``server`` (a threaded WSGI server on 127.0.0.1).
"""

from infra.local.core.clock import ManualClock, SystemClock
from infra.local.tpu.models import NodeEvent, TpuBackend

__all__ = ["ManualClock", "NodeEvent", "SystemClock", "TpuBackend"]
