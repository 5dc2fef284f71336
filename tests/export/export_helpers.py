"""Export test helpers: an Orbax-style run in fake GCS, a model bucket in moto, a spec file.

Names are unique per test (buckets, groups, trail prefix) so no reset of the shared stack is needed.
"""

from __future__ import annotations

import json
import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

MANIFEST = {"snapshot_id": "snap-3f2a9c", "objects": [{"key": "train/shard-0.safetensors", "size": 10}]}


@dataclass
class Run:
    run_id: str
    checkpoint_dir: str
    run_uri: str
    manifest_uri: str
    spec_file: Path
    destination: str
    group: str
    settings: Any


def write_run(gcs: Any, bucket: str, run_id: str, *, big: int = 0) -> tuple[str, str]:
    """Steps 100 and 200 committed, 300 interrupted (item marker only), job.json, manifest, goodput.

    ``big``: the size of step 200's state (the step an export packages), else 2 KiB.
    """
    b = gcs.bucket(bucket)
    base = f"runs/{run_id}"
    for step in (100, 200, 300):
        b.blob(f"{base}/{step}/state/array.bin").upload_from_string(os.urandom(big if big and step == 200 else 2048))
        b.blob(f"{base}/{step}/state/commit_success.txt").upload_from_string(b"ok")
        b.blob(f"{base}/{step}/_CHECKPOINT_METADATA").upload_from_string(json.dumps({"step": step}))
        if step != 300:
            b.blob(f"{base}/{step}/commit_success.txt").upload_from_string(b"ok")
    manifest = f"gs://{bucket}/data/_tpu_ops/manifests/snap-3f2a9c.json"
    b.blob("data/_tpu_ops/manifests/snap-3f2a9c.json").upload_from_string(json.dumps(MANIFEST))
    b.blob(f"{base}/_tpu_ops/job.json").upload_from_string(json.dumps({"run_id": run_id, "dataset_manifest": manifest}))
    goodput = {"final_step": 200, "wall_s": 900.0, "productive_s": 810.0,
               "preemptions": [{"number": 1, "reason": "node PREEMPTED", "last_step": 150, "resume_step": 100,
                               "steps_lost": 50, "detect_s": 4.1, "reprovision_s": 30.2,
                               "overhead_s": 36.123456789}]}  # fmt: skip
    b.blob(f"{base}/_tpu_ops/goodput.json").upload_from_string(json.dumps(goodput))
    return f"gs://{bucket}/runs", manifest


def make_run(local_stack: Any, tmp_path: Path, *, big: int = 0) -> Run:
    """A fresh run, model bucket and spec (and the settings the environment now describes)."""
    from infra.local.seed import ensure_gcs_bucket, ensure_model_bucket
    from tpu_ops.cloud.clients import storage_client
    from tpu_ops.settings import Settings

    tag = uuid.uuid4().hex[:8]
    settings = Settings()
    ckpt_bucket, models = f"ckpt-{tag}", f"models-{tag}"
    ensure_gcs_bucket(settings, f"gs://{ckpt_bucket}", "US-CENTRAL1")
    ensure_model_bucket(settings, f"s3://{models}")
    run_id = f"fraud-{tag}"
    checkpoint_dir, manifest = write_run(storage_client(settings), ckpt_bucket, run_id, big=big)
    group = f"fraud-model-{tag}"
    spec = {"destination": f"s3://{models}/fraud", "model_package_group": group, "checkpoint": checkpoint_dir}
    spec_file = tmp_path / f"export-{tag}.yaml"
    spec_file.write_text(yaml.safe_dump(spec))
    return Run(run_id, checkpoint_dir, f"{checkpoint_dir}/{run_id}", manifest, spec_file, spec["destination"], group,
               settings)  # fmt: skip
