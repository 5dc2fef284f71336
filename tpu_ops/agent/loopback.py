"""The dry run's "every endpoint on loopback" guard, applied to the environment a trainer gets.

In a dry run (``TPU_OPS_DRY_RUN`` true) the agent refuses to start a trainer whose environment
names a non-loopback endpoint, or which points Google's Python clients at the GCS emulator but
leaves TensorStore (Orbax's storage layer) on Google's host: an unmodified Orbax save would then
try ``storage.googleapis.com`` and hang.
"""

from __future__ import annotations

import ipaddress
import urllib.parse
from collections.abc import Mapping

# Variables that name where a trainer's clients go.
ENDPOINT_VARS = (
    "STORAGE_EMULATOR_HOST",
    "TENSORSTORE_GCS_HTTP_URL",
    "GCE_METADATA_HOST",
    "GCE_METADATA_IP",
    "TPU_OPS_METADATA_HOST",
    "AWS_ENDPOINT_URL",
    "TPU_OPS_GCS_ENDPOINT",
    "TPU_OPS_LOGGING_ENDPOINT",
)
TRUE = ("1", "true", "yes", "on")


class LoopbackError(Exception):
    """A dry-run trainer environment would reach beyond loopback (names the variable)."""


def is_loopback(value: str) -> bool:
    """True when ``value`` (``http://host:port``, ``host:port`` or an address) names a loopback host."""
    url = value if "://" in value else "http://" + value
    host = urllib.parse.urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_trainer_env(env: Mapping[str, str]) -> None:
    """Raise ``LoopbackError`` if ``env`` is a dry run's and could reach a real cloud."""
    if (env.get("TPU_OPS_DRY_RUN") or "").strip().lower() not in TRUE:
        return
    for name in ENDPOINT_VARS:
        value = env.get(name)
        if value and not is_loopback(value):
            raise LoopbackError(f"dry run: the trainer's {name}={value!r} is not on loopback; refusing to start it")
    for name in ("STORAGE_EMULATOR_HOST", "GCE_METADATA_HOST"):
        if not env.get(name):
            raise LoopbackError(f"dry run: the trainer's {name} is not set; its clients would reach Google")
    if not env.get("TENSORSTORE_GCS_HTTP_URL"):
        raise LoopbackError(
            "dry run: STORAGE_EMULATOR_HOST is set but TENSORSTORE_GCS_HTTP_URL is not, so TensorStore (Orbax) "
            "would write to Google's host; `tpu-ops local up` exports both"
        )
