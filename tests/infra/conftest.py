"""Fixtures for the emulated clouds. ``local_stack`` (session) is the one to promote to tests/conftest.py."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# Tests in this folder import their helpers (tests/infra/tpu/adapters.py) by folder-relative name.
sys.path.insert(0, str(Path(__file__).parent))
os.environ.setdefault("NO_GCE_CHECK", "true")  # google-auth must never probe a metadata server


@pytest.fixture(scope="session")
def local_stack() -> Iterator[object]:
    """The whole local stack (moto, fake-gcs-server, fake TPU API, host simulator), once per session."""
    from infra.local.stack import LocalStack

    with LocalStack() as stack:
        yield stack
