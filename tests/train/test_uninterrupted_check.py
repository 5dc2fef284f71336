"""The dry run's final-parameters check finds a difference of one bit, and none where there is none."""

from __future__ import annotations

import io
import os
from typing import Any

import numpy as np

from flows.commands._baseline import compare_with_uninterrupted
from flows.report import params_line
from tpu_ops.specs.jobs import TrainSpec


def _put(gcs: Any, bucket: str, key: str, arr: Any) -> None:
    buf = io.BytesIO()
    np.save(buf, arr)
    gcs.bucket(bucket).blob(key).upload_from_string(buf.getvalue())


def test_the_check_reruns_the_trainer_and_compares_every_bit(stack: Any, gcs: Any, ckpt_bucket: str) -> None:
    train = TrainSpec(checkpoint_dir=f"gs://{ckpt_bucket}/c", steps=4, checkpoint_every=2, hyperparameters={"seed": 5})
    env = dict(os.environ, **stack.env())
    first = compare_with_uninterrupted(env, gcs, train, f"gs://{ckpt_bucket}/c/r1", None, 4)
    assert first is not None and not first["equal"] and first["max_rel_diff"] is None  # the run saved nothing
    # the run's parameters: the uninterrupted ones, split in two parts (two processes)
    done = gcs.bucket(ckpt_bucket).blob("c/r1-uninterrupted/4/params/part-00000.npy").download_as_bytes()
    ref = np.load(io.BytesIO(done))
    _put(gcs, ckpt_bucket, "c/r1/4/params/part-00000.npy", ref[:3])
    _put(gcs, ckpt_bucket, "c/r1/4/params/part-00001.npy", ref[3:])
    same = compare_with_uninterrupted(env, gcs, train, f"gs://{ckpt_bucket}/c/r1", None, 4)
    assert same is not None and same["bit_identical"] and same["max_rel_diff"] == 0.0
    assert params_line(same) == "bit-identical to an uninterrupted run"
    off = ref[3:].copy()
    off[0] = np.nextafter(off[0], np.inf)  # one value, one ulp
    _put(gcs, ckpt_bucket, "c/r1/4/params/part-00001.npy", off)
    differ = compare_with_uninterrupted(env, gcs, train, f"gs://{ckpt_bucket}/c/r1", None, 4)
    assert differ is not None and not differ["bit_identical"] and 0 < differ["max_rel_diff"] < 1e-12
    assert params_line(differ).startswith("DIFFER from an uninterrupted run (max relative difference")
    other = train.model_copy(update={"command": ["python3", "train.py"]})
    assert compare_with_uninterrupted(env, gcs, other, "gs://b/r", None, 4) is None  # not the reference trainer
