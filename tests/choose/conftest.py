"""Fixtures for the cost-ranked ladder's tests: fake-gcs-server alone (no full stack)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session")
def gcs_env() -> Iterator[dict[str, str]]:
    """fake-gcs-server alone (no full stack): the environment that points tpu-ops at it."""
    from infra.local.gcs import FakeGcs

    server = FakeGcs()
    server.start()
    try:
        yield {"TPU_OPS_DRY_RUN": "true", "TPU_OPS_GCS_ENDPOINT": server.url, "STORAGE_EMULATOR_HOST": server.url}
    finally:
        server.stop()
