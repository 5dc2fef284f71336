"""The reference trainer: numpy only, small, deterministic; the default for dry runs.

It follows the job contract (``JobEnv``) like any user trainer: a linear model fitted by SGD on
the token shards named by the dataset manifest (synthetic data without one). Checkpoints use the
Orbax commit protocol: every worker writes its part of the parameters under ``<step>/params/``,
then worker 0 waits for every part and writes ``<step>/commit_success.txt`` last. Each step's
batch depends only on the step number, so with a fixed seed the final parameters are
bit-identical whether or not the run was preempted and resumed.

Hyperparameters (all optional): ``seed``, ``learning_rate``, ``batch_size``, ``features``,
``data_shards``, ``step_delay_s`` (make steps last longer in demos and tests), and fault hooks for
tests: ``fail_at_step`` (exit 1 there), ``hang_at_step`` (hang there on a fresh start),
``slow_commit_step`` + ``commit_delay_s`` (pause between the parts and the commit marker).
"""

from __future__ import annotations

import io
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from tpu_ops.agent.goodput_hooks import record
from tpu_ops.cloud.clients import storage_client
from tpu_ops.cloud.translate import google_errors
from tpu_ops.mirror import manifest as manifests
from tpu_ops.settings import JobEnv, Settings
from tpu_ops.train.checkpoints import COMMIT_MARKER
from tpu_ops.uris import ObjectUri, parse_gs

SEQ_SCALE = 32_000.0
PART_WAIT_S = 600.0


def load_data(gcs: Any, manifest_uri: str | None, hp: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """Features and targets: token windows scaled to [0, 1) from the manifest's shards."""
    from safetensors.numpy import load

    features = int(hp.get("features", 16))
    if not manifest_uri:
        rng = np.random.default_rng(int(hp.get("seed", 0)) + 1)
        tokens = rng.integers(0, 32_000, size=(1024, features + 1), dtype=np.int32)
    else:
        doc = manifests.load(gcs, manifest_uri)
        dest = parse_gs(doc["destination"])
        keys = sorted(r["key"] for r in doc["objects"] if r["key"].endswith(".safetensors"))
        chunks = []
        for key in keys[: int(hp.get("data_shards", 2))]:
            with google_errors("gcs"):
                raw = gcs.bucket(dest.bucket).blob(dest.key(key)).download_as_bytes()
            chunks.append(load(raw)["tokens"][:, : features + 1])
        if not chunks:
            raise SystemExit(f"reference trainer: manifest {manifest_uri} names no .safetensors shard")
        tokens = np.concatenate(chunks)
    data = tokens.astype(np.float64) / SEQ_SCALE
    return data[:, :features], data[:, features]


def sgd_step(params: np.ndarray, x: np.ndarray, y: np.ndarray, step: int, lr: float, batch: int) -> np.ndarray:
    """One step on the batch that ``step`` (alone) selects: mean-squared error of a linear model."""
    rows = (np.arange(batch) + (step - 1) * batch) % len(x)
    xb, yb = x[rows], y[rows]
    err = xb @ params[:-1] + params[-1] - yb
    grad = np.concatenate([xb.T @ err, [err.sum()]]) * (2.0 / batch)
    return params - lr * grad


def _npy(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=False)
    return buf.getvalue()


def _put(gcs: Any, uri: ObjectUri, data: bytes | str) -> None:
    with google_errors("gcs"):
        gcs.bucket(uri.bucket).blob(uri.prefix).upload_from_string(data)


def _wait_for(gcs: Any, step_dir: ObjectUri, names: set[str], step: int) -> None:
    deadline = time.monotonic() + PART_WAIT_S
    while True:
        with google_errors("gcs"):
            blobs = gcs.list_blobs(step_dir.bucket, prefix=step_dir.prefix + "/")
            have = {b.name[len(step_dir.prefix) + 1 :] for b in blobs}
        if names <= have:
            return
        if time.monotonic() > deadline:
            raise SystemExit(f"reference trainer: step {step}: {sorted(names - have)} never appeared")
        time.sleep(0.05)


def save(gcs: Any, env: JobEnv, step: int, params: np.ndarray, hp: dict[str, Any]) -> None:
    """Write this worker's part; worker 0 commits the step once every part exists.

    Every worker then waits for the commit (a barrier, as a synchronous multi-host save is), so no
    worker runs more than ``checkpoint_every`` steps past the newest committed step.
    """
    step_dir = parse_gs(env.checkpoint_dir).child(str(step))
    part = np.array_split(params, env.workers)[env.worker]
    _put(gcs, step_dir.child(f"params/part-{env.worker:05d}.npy"), _npy(part))
    if env.worker != 0:
        _wait_for(gcs, step_dir, {COMMIT_MARKER}, step)
        return
    _wait_for(gcs, step_dir, {f"params/part-{w:05d}.npy" for w in range(env.workers)}, step)
    _put(gcs, step_dir.child(f"params/{COMMIT_MARKER}"), "")  # item-level marker, as Orbax writes
    _put(gcs, step_dir.child("meta.json"), json.dumps({"step": step, "workers": env.workers}))
    if int(hp.get("slow_commit_step", -1)) == step:
        time.sleep(float(hp.get("commit_delay_s", 0.0)))
    _put(gcs, step_dir.child(COMMIT_MARKER), "")  # last: this commits the step
    print(f"worker {env.worker}: committed step {step}", flush=True)


def restore(gcs: Any, env: JobEnv, step: int) -> np.ndarray:
    """The parameters of a committed step, from every worker's part."""
    step_dir = parse_gs(env.checkpoint_dir).child(f"{step}/params")
    with google_errors("gcs"):
        blobs = sorted(
            (b for b in gcs.list_blobs(step_dir.bucket, prefix=step_dir.prefix + "/part-")), key=lambda b: b.name
        )
        parts = [np.load(io.BytesIO(b.download_as_bytes()), allow_pickle=False) for b in blobs]
    if not parts:
        raise SystemExit(f"reference trainer: step {step} has no parameter parts under {step_dir}")
    return np.concatenate(parts)


def _progress(path: Path | None, step: int) -> None:
    if path is None:
        return
    tmp = path.with_suffix(".tmp")
    tmp.write_text(f"{step}\n")
    os.replace(tmp, path)


def main() -> int:
    """Train from ``TPU_OPS_RESUME_STEP`` (or from scratch) to ``TPU_OPS_STEPS``."""
    env = JobEnv()
    hp = env.hyperparameters
    gcs = storage_client(Settings())
    t0 = time.time()
    x, y = load_data(gcs, env.dataset_manifest, hp)
    record(env.step_log, "data", None, t0, time.time())  # goodput: the trainer's own records (TPU_OPS_STEP_LOG)
    if env.resume_step is not None:
        t0 = time.time()
        params, start = restore(gcs, env, env.resume_step), env.resume_step
        record(env.step_log, "restore", start, t0, time.time())
        print(f"worker {env.worker}: restored step {start}", flush=True)
    else:
        params, start = np.random.default_rng(int(hp.get("seed", 0))).normal(0, 0.1, x.shape[1] + 1), 0
        print(f"worker {env.worker}: fresh start", flush=True)
    lr, batch = float(hp.get("learning_rate", 0.1)), int(hp.get("batch_size", 64))
    delay = float(hp.get("step_delay_s", 0))
    t_mark = time.time()  # records back to back: the loop's own overhead belongs to the next step
    for step in range(start + 1, env.steps + 1):
        if int(hp.get("fail_at_step", -1)) == step:
            print(f"worker {env.worker}: injected failure at step {step}", file=sys.stderr, flush=True)
            return 1
        if int(hp.get("hang_at_step", -1)) == step and env.resume_step is None:
            print(f"worker {env.worker}: injected hang at step {step}", flush=True)
            while True:
                time.sleep(3600)
        t0 = t_mark
        params = sgd_step(params, x, y, step, lr, batch)
        if delay:
            time.sleep(delay)
        t_mark = time.time()
        record(env.step_log, "step", step, t0, t_mark)  # before the save: a committed step is always recorded
        if step % env.checkpoint_every == 0 or step == env.steps:
            save(gcs, env, step, params, hp)
            saved = time.time()
            record(env.step_log, "save", step, t_mark, saved)
            t_mark = saved
        _progress(env.progress_file, step)
    loss = float(np.mean((x @ params[:-1] + params[-1] - y) ** 2))
    print(f"worker {env.worker}: done at step {env.steps}, loss {loss:.6f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
