"""What the Compute Engine fake's tests share (imported as ``compute.helpers``; tests/infra is on sys.path)."""

from compute.loopback_guard import loopback_only

PROJECT = "proj"
ZONE = "us-east5-a"
REGION = "us-east5"

__all__ = ["PROJECT", "REGION", "ZONE", "loopback_only"]
