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


@pytest.fixture
def train_settings(stack: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Settings on the (reset) session stack with fast provisioning polls; the wheel cache is shared."""
    return stack.settings(
        poll_interval_s=0.1,
        retry_initial_delay_s=0.05,
        retry_max_delay_s=0.2,
        state_dir=tmp_path_factory.getbasetemp() / "train-state",
    )


@pytest.fixture
def ckpt_bucket(gcs: Any, stack: Any, train_settings: Any) -> str:
    """A fresh checkpoint bucket (the stack was just reset), with the reference trainer's wheelhouse
    (numpy) under ``wheelhouse/``: its setup step installs from there, as on a VM without an index."""
    from infra.local.wheelhouse import upload_wheelhouse

    gcs.create_bucket("ckpt")
    upload_wheelhouse(train_settings, "gs://ckpt/wheelhouse")
    return "ckpt"


@pytest.fixture
def nothing_left(stack: Any) -> Iterator[None]:
    """After the test: no queued resource, no node, no worker process."""
    yield
    from infra.local._proc import wait_until

    def clean() -> bool:
        s = stack.state()
        return s["queued_resources"] == 0 and s["nodes"] == 0 and not s["worker_pids"]

    wait_until(clean, 15.0, what="no slice and no worker process left")
