"""Fixtures for training tests: the session stack's GCS emulator and a fresh bucket per test."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from typing import Any

import pytest

_buckets = itertools.count()


@pytest.fixture
def gcs(local_stack: Any) -> Any:
    """A ``google.cloud.storage.Client`` on the stack's fake-gcs-server."""
    from tpu_ops.cloud.clients import storage_client

    return storage_client(local_stack.settings())


@pytest.fixture
def bucket(gcs: Any) -> Iterator[str]:
    """A new, empty bucket (name unique in the session); deleted with its objects afterwards."""
    name = f"train-{os.getpid()}-{next(_buckets)}"
    b = gcs.create_bucket(name)
    yield name
    for blob in gcs.list_blobs(name):
        blob.delete()
    b.delete()
