"""The reference trainer with elastic shapes: a run that changes shape on the way ends bit-identical to an
uninterrupted target-shape run (fake-gcs-server alone; the trainer as a process, as the agent starts it)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from tpu_ops.agent.job import JobEnv
from tpu_ops.train.reference import micro_batches, sgd_step

HP = json.dumps({"seed": 3, "batch_size": 64, "learning_rate": 0.05})


@pytest.fixture(scope="module")
def gcs_env() -> Iterator[dict[str, str]]:
    from infra.local.gcs import FakeGcs
    from infra.local.metadata import MetadataServer

    server, md = FakeGcs(), MetadataServer({}).start()  # no token: the emulator needs none (all on loopback)
    server.start()
    try:
        yield {"TPU_OPS_DRY_RUN": "true", "TPU_OPS_GCS_ENDPOINT": server.url, "STORAGE_EMULATOR_HOST": server.url,
               "GCE_METADATA_HOST": md.host}  # fmt: skip
    finally:
        server.stop()
        md.stop()


def _shape(chips: int, accum: int, shape: str) -> dict[str, str]:
    return {"TPU_OPS_CHIPS": str(chips), "TPU_OPS_ACCUM_STEPS": str(accum), "TPU_OPS_TARGET_CHIPS": "16",
            "TPU_OPS_SHAPE": shape, "TPU_OPS_TARGET_SHAPE": "v5p-32"}  # fmt: skip


def _train(gcs_env: dict[str, str], ckpt: str, steps: int, shape: dict[str, str], resume: int | None = None) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TPU_OPS_", "OPENBLAS_"))}  # as on a worker
    env.update(gcs_env)
    env.update({"TPU_OPS_RUN_ID": "r", "TPU_OPS_CHECKPOINT_DIR": ckpt, "TPU_OPS_STEPS": str(steps),
                "TPU_OPS_CHECKPOINT_EVERY": "5", "TPU_OPS_HYPERPARAMETERS": HP, **shape})  # fmt: skip
    if resume is not None:
        env["TPU_OPS_RESUME_STEP"] = str(resume)
    out = subprocess.run([sys.executable, "-m", "tpu_ops.train.reference"], env=env, capture_output=True, text=True,
                         timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def _params(gcs_env: dict[str, str], bucket: str, run: str, step: int) -> bytes:
    from tpu_ops.cloud.clients import storage_client
    from tpu_ops.settings import Settings

    gcs = storage_client(Settings(dry_run=True, gcs_endpoint=gcs_env["TPU_OPS_GCS_ENDPOINT"]))
    blobs = sorted(gcs.list_blobs(bucket, prefix=f"{run}/{step}/params/part-"), key=lambda b: b.name)
    return np.concatenate([np.load(io.BytesIO(b.download_as_bytes())) for b in blobs]).tobytes()


def test_a_run_that_falls_back_to_half_the_chips_ends_bit_identical(gcs_env: dict[str, str]) -> None:
    from tpu_ops.cloud.clients import storage_client
    from tpu_ops.settings import Settings

    storage_client(Settings(dry_run=True, gcs_endpoint=gcs_env["TPU_OPS_GCS_ENDPOINT"])).create_bucket("elastic-ref")
    target = _shape(16, 1, "v5p-32")
    _train(gcs_env, "gs://elastic-ref/uninterrupted", 20, target)
    # v5p-32 to step 5, v5p-16 (accumulating 2) to step 10, v5p-8 (4) to 15, back on v5p-32 to 20
    _train(gcs_env, "gs://elastic-ref/elastic", 5, target)
    out = _train(gcs_env, "gs://elastic-ref/elastic", 10, _shape(8, 2, "v5p-16"), resume=5)
    assert "shape v5p-16 (target v5p-32), 2 micro-batch(es) per chip" in out
    _train(gcs_env, "gs://elastic-ref/elastic", 15, _shape(4, 4, "v5p-8"), resume=10)
    _train(gcs_env, "gs://elastic-ref/elastic", 20, target, resume=15)
    want = _params(gcs_env, "elastic-ref", "uninterrupted", 20)
    assert _params(gcs_env, "elastic-ref", "elastic", 20) == want
    # and it is the target's arithmetic (one micro-batch per target chip), not a one-batch step's
    _train(gcs_env, "gs://elastic-ref/plain", 20, {})
    assert _params(gcs_env, "elastic-ref", "plain", 20) != want


def _env(**kw: Any) -> JobEnv:
    return JobEnv("r", 0, 1, "gs://b/r", 10, 5, **kw)


def test_the_micro_batches_are_the_target_chips_and_must_add_up() -> None:
    assert micro_batches(_env(), 64) == 1  # no shapes: one batch, as before
    assert micro_batches(_env(chips=8, accum_steps=2, target_chips=16), 64) == 16
    with pytest.raises(SystemExit, match="chips 8 x accum_steps 1"):
        micro_batches(_env(chips=8, accum_steps=1, target_chips=16), 64)  # the global batch would shrink
    with pytest.raises(SystemExit, match="batch_size 40 must split over the target's 16 chips"):
        micro_batches(_env(chips=16, accum_steps=1, target_chips=16), 40)


def test_one_micro_batch_is_the_step_as_it_was() -> None:
    rng = np.random.default_rng(0)
    x, y, params = rng.random((128, 4)), rng.random(128), rng.random(5)
    rows = np.arange(32) + 32
    err = x[rows] @ params[:-1] + params[-1] - y[rows]
    before = params - 0.1 * np.concatenate([x[rows].T @ err, [err.sum()]]) * (2.0 / 32)  # the step before shapes
    assert sgd_step(params, x, y, 2, 0.1, 32).tobytes() == before.tobytes()
    assert np.allclose(sgd_step(params, x, y, 2, 0.1, 32, micro=8), before, rtol=1e-12, atol=0)
