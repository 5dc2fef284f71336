"""What a simulated worker is: Google's image as it is (a bare python3, no index, nothing of the host),
the job's setup step, and a setup that fails."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from train_helpers import Run, job_spec

from tpu_ops.errors import TrainingError

pytestmark = pytest.mark.usefixtures("nothing_left")
ROOT = Path(__file__).resolve().parents[2]
DUMP = (  # one line: job argv may not hold control characters
    "import importlib.util as u, json, os, sys; "
    "mods = ('numpy', 'yaml', 'pydantic', 'google', 'boto3', 'pip', 'tpu_ops'); "
    "spec = {m: u.find_spec(m) for m in mods}; "
    "json.dump({'path': sys.path, 'env': dict(os.environ), 'found': {m: s is not None for m, s in spec.items()}, "
    "'tpu_ops': spec['tpu_ops'] and spec['tpu_ops'].origin}, open(sys.argv[1], 'w')); "
    "len(sys.argv) > 2 and open(os.environ['TPU_OPS_PROGRESS_FILE'], 'w').write('1')"
)
# Variables of the host's environment a worker may share (with its own values, checked below).
SHARED_NAMES = {"PATH", "HOME", "LANG", "PWD", "SHLVL", "_", "OLDPWD", "TPU_OPS_DRY_RUN"}


def _check_bare(seen: dict[str, Any], workdir: Path) -> None:
    host_prefixes = (sys.prefix, str(ROOT))
    assert not [p for p in seen["path"] if p.startswith(host_prefixes)], seen["path"]
    assert not any(seen["found"][m] for m in ("numpy", "yaml", "pydantic", "google", "boto3", "pip")), seen["found"]
    env = seen["env"]
    leaked = (set(env) & set(os.environ)) - SHARED_NAMES
    assert not leaked, leaked
    assert env["PIP_NO_INDEX"] == "1" and env["PIP_CONFIG_FILE"] == os.devnull
    assert "VIRTUAL_ENV" not in env and not any(k.startswith(("AWS_", "PREFECT_")) for k in env)
    assert sys.prefix not in env["PATH"] and env["HOME"].startswith(str(workdir.parent))
    assert seen["tpu_ops"].startswith(str(workdir))  # the agent wheel, unpacked on the worker


def test_a_worker_and_its_trainer_see_google_s_image_and_nothing_of_the_host(
    stack: Any, ckpt_bucket: str, train_settings: Any
) -> None:
    job = job_spec(ckpt_bucket, steps=1, checkpoint_every=1, setup=["python3", "-c", DUMP, "worker.json"],
                   command=["python3", "-c", DUMP, "trainer.json", "progress"])  # fmt: skip
    report = Run(job, "bare", train_settings).result()
    assert report.outcome == "done"
    (worker,) = stack.hosts.workers("us-central2-b", report.incarnations[-1].queued_resource)
    workdir = worker.workdir / "bare"
    for name in ("worker.json", "trainer.json"):
        _check_bare(json.loads((workdir / name).read_text()), workdir)
    trainer = json.loads((workdir / "trainer.json").read_text())["env"]
    assert trainer["TPU_OPS_WORKER"] == "0" and trainer["TPU_WORKER_ID"] == "0" and trainer["TPU_OPS_RUN_ID"] == "bare"
    assert trainer["TENSORSTORE_GCS_HTTP_URL"] == trainer["STORAGE_EMULATOR_HOST"]  # what Orbax needs on the stack


def test_a_failing_setup_fails_the_run_within_a_poll_with_its_log_tail(
    stack: Any, gcs: Any, ckpt_bucket: str, train_settings: Any
) -> None:
    script = "echo 'Looking in indexes: (none)'; echo 'ERROR: No matching distribution for jax' >&2; exit 7"
    setup = ["bash", "-c", script]
    run = Run(job_spec(ckpt_bucket, setup=setup), "nosetup", train_settings)
    run.thread.join(60)
    assert isinstance(run.error, TrainingError), run.error
    assert run.error.exit_code == 7 and "No matching distribution for jax" in str(run.error)
    report = json.loads(gcs.bucket(ckpt_bucket).blob("runs/nosetup/_tpu_ops/workers/worker-0.json").download_as_bytes())
    assert report["phase"] == "setup" and report["terminated"] is False and report["setup_s"] is not None
    assert run.error_at is not None and run.error_at - report["time"] <= 0.5 + 1.0  # one poll, plus its GCS calls
    goodput = json.loads(gcs.bucket(ckpt_bucket).blob("runs/nosetup/_tpu_ops/goodput.json").download_as_bytes())
    assert goodput["recoveries"] == 0 and len(goodput["incarnations"]) == 1  # no recovery loop


def test_the_reference_trainer_reads_safetensors_without_the_library(tmp_path: Path) -> None:
    from safetensors.numpy import save

    from tpu_ops.train.reference import read_safetensors

    tokens = np.arange(24, dtype=np.int32).reshape(4, 6)
    raw = save({"tokens": tokens, "mask": np.ones(3, dtype=np.float16)}, metadata={"k": "v"})
    assert np.array_equal(read_safetensors(raw, "tokens"), tokens)
    assert read_safetensors(raw, "mask").dtype == np.float16
