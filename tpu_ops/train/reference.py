"""The reference trainer: numpy plus the standard library, small, deterministic; the default for dry runs.

It follows the job contract (``tpu_ops.agent.job.job_env``) like any user trainer: a linear model
fitted by SGD on the token shards named by the dataset manifest (synthetic data without one). It
talks to GCS with the agent's standard-library client, so on a VM it needs only numpy, which the
job's ``setup`` step provides (docs/training.md). Checkpoints use the Orbax commit protocol:
every worker writes its part of the parameters under ``<step>/params/``, then worker 0 waits for
every part and writes ``<step>/commit_success.txt`` last. Each step's batch depends only on the
step number, so with a fixed seed the final parameters are bit-identical whether or not the run
was preempted and resumed.

On SIGTERM (a preemption notice) it finishes the step in hand and, when the remaining grace
(``TPU_OPS_TERM_GRACE_S``) allows, saves a complete checkpoint of that step before exiting 143.
On a multi-host slice the workers first agree on the step to save (the highest any of them
reached, through ``<checkpoint_dir>/_preemption/<incarnation>/``), as JAX's preemption sync point
does for Orbax.

Each step record says what the step does (the job contract's ``tokens`` and ``flops``, for $/M tokens
and MFU): an example is a window of ``features + 1`` tokens (the inputs and the one token it
predicts), so a step trains on ``batch_size * (features + 1)`` tokens; its model FLOPs follow the
usual 6 * parameters per predicted token (2 forward, 4 backward), one prediction per example:
``6 * (features + 1) * batch_size``. Every worker trains the same batch (the model is replicated),
so these are the slice's figures, counted once.

Elastic shapes (docs/elastic.md): the step's gradient is the sum, in index order, of one micro-batch per
chip of the target shape; on a smaller shape each chip accumulates ``TPU_OPS_ACCUM_STEPS`` of them, so the
step, and the final parameters, are bit-identical to the target shape's. Having no interconnect, every
process computes every micro-batch (what an all-reduce of the per-chip gradients would hand it).

Hyperparameters (all optional): ``seed``, ``learning_rate``, ``batch_size``, ``features``,
``data_shards``, ``step_delay_s`` (make steps last longer in demos and tests), ``save_on_term``
(default true), and fault hooks for tests: ``fail_at_step`` (exit 1 there), ``hang_at_step`` (hang
there on a fresh start), ``slow_commit_step`` + ``commit_delay_s`` (pause between the parts and the
commit marker).
"""

from __future__ import annotations

import io
import json
import os
import signal
import struct
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np

from tpu_ops.agent.gcs import Gcs, join, split_gs
from tpu_ops.agent.goodput_hooks import record
from tpu_ops.agent.job import COMMIT_MARKER, JobEnv, job_env

SEQ_SCALE = 32_000.0
PART_WAIT_S = 600.0
_DTYPES = {"I32": np.int32, "I64": np.int64, "U16": np.uint16, "U32": np.uint32, "F32": np.float32,
           "F64": np.float64, "I16": np.int16, "U8": np.uint8, "F16": np.float16}  # fmt: skip


def read_safetensors(raw: bytes, name: str) -> np.ndarray:
    """Tensor ``name`` of a ``.safetensors`` file (8-byte header length, JSON header, little-endian data)."""
    (n,) = struct.unpack("<Q", raw[:8])
    info = json.loads(raw[8 : 8 + n])[name]
    if info["dtype"] not in _DTYPES:
        raise SystemExit(f"reference trainer: tensor {name!r} has dtype {info['dtype']}; it reads {sorted(_DTYPES)}")
    start, end = info["data_offsets"]
    dtype = np.dtype(_DTYPES[info["dtype"]]).newbyteorder("<")
    return np.frombuffer(raw[8 + n + start : 8 + n + end], dtype=dtype).reshape(info["shape"])


def load_data(gcs: Gcs, manifest_uri: str | None, hp: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """Features and targets: token windows scaled to [0, 1) from the manifest's shards."""
    features = int(hp.get("features", 16))
    if not manifest_uri:
        rng = np.random.default_rng(int(hp.get("seed", 0)) + 1)
        tokens = rng.integers(0, 32_000, size=(1024, features + 1), dtype=np.int32)
    else:
        doc = gcs.read_json(*split_gs(manifest_uri))
        bucket, prefix = split_gs(doc["destination"])
        keys = sorted(r["key"] for r in doc["objects"] if r["key"].endswith(".safetensors"))
        chunks = []
        for key in keys[: int(hp.get("data_shards", 2))]:
            raw = gcs.read(bucket, join(prefix, key) if prefix else key)
            chunks.append(read_safetensors(raw, "tokens")[:, : features + 1])
        if not chunks:
            raise SystemExit(f"reference trainer: manifest {manifest_uri} names no .safetensors shard")
        tokens = np.concatenate(chunks)
    data = tokens.astype(np.float64) / SEQ_SCALE
    return data[:, :features], data[:, features]


def step_work(features: int, batch: int) -> tuple[int, int]:
    """(tokens, model FLOPs) of one step of the linear model (the module docstring says why)."""
    params = features + 1
    return batch * (features + 1), 6 * params * batch


def sgd_step(
    params: np.ndarray, x: np.ndarray, y: np.ndarray, step: int, lr: float, batch: int, micro: int = 1
) -> np.ndarray:
    """One step on the batch that ``step`` (alone) selects: mean-squared error of a linear model.

    The batch's gradient is summed over ``micro`` equal micro-batches in their global order (elastic
    shapes: one per target chip, :func:`micro_batches`), so the step is the same whatever shape computes it.
    """
    rows = (np.arange(batch) + (step - 1) * batch) % len(x)
    size = batch // micro
    grad = np.zeros_like(params)
    for k in range(micro):
        xb, yb = x[rows[k * size : (k + 1) * size]], y[rows[k * size : (k + 1) * size]]
        err = xb @ params[:-1] + params[-1] - yb
        grad += np.concatenate([xb.T @ err, [err.sum()]])
    return params - lr * grad * (2.0 / batch)


def micro_batches(env: JobEnv, batch: int) -> int:
    """How many micro-batches one step's batch is summed over: one per chip of the target shape.

    With elastic shapes the global batch is split over the target's chips: on a shape with fewer chips
    each chip accumulates ``accum_steps`` micro-batches (processes x chips per process x accumulation =
    target chips), so the micro-batches, and their sum in index order, are the target's on every shape.
    Without shapes (``target_chips`` 0): one batch, as before.
    """
    if env.target_chips <= 0:
        return 1
    if env.chips * env.accum_steps != env.target_chips or batch % env.target_chips:
        raise SystemExit(
            f"reference trainer: batch_size {batch} must split over the target's {env.target_chips} chips "
            f"(chips {env.chips} x accum_steps {env.accum_steps})"
        )
    what = f"shape {env.shape} (target {env.target_shape}), {env.accum_steps} micro-batch(es) per chip"
    print(f"worker {env.process_id}: {what}", flush=True)
    return env.target_chips


def _npy(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=False)
    return buf.getvalue()


def _wait_for(
    gcs: Gcs,
    bucket: str,
    step_key: str,
    names: set[str],
    step: int,
    timeout: float = PART_WAIT_S,
    stop: Callable[[], bool] | None = None,
) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        have = {i["name"][len(step_key) + 1 :] for i in gcs.list_objects(bucket, step_key + "/")}
        if names <= have:
            return True
        if stop is not None and stop():  # SIGTERM while waiting for others that may be gone: save on term
            return False
        if time.monotonic() > deadline:
            if timeout < PART_WAIT_S:
                return False
            raise SystemExit(f"reference trainer: step {step}: {sorted(names - have)} never appeared")
        time.sleep(0.05)


def save(
    gcs: Gcs,
    env: JobEnv,
    step: int,
    params: np.ndarray,
    hp: dict[str, Any],
    timeout: float = PART_WAIT_S,
    stop: Callable[[], bool] | None = None,
) -> bool:
    """Write this worker's part; worker 0 commits the step once every part exists.

    Every worker then waits for the commit (a barrier, as a synchronous multi-host save is), so no
    worker runs more than ``checkpoint_every`` steps past the newest committed step.
    """
    bucket, root = split_gs(env.checkpoint_dir)
    step_key = join(root, str(step)) if root else str(step)
    part = np.array_split(params, env.processes)[env.process_id]
    gcs.write(bucket, join(step_key, f"params/part-{env.process_id:05d}.npy"), _npy(part))
    if env.process_id != 0:
        return _wait_for(gcs, bucket, step_key, {COMMIT_MARKER}, step, timeout, stop)
    parts = {f"params/part-{w:05d}.npy" for w in range(env.processes)}
    if not _wait_for(gcs, bucket, step_key, parts, step, timeout, stop):
        return False
    gcs.write(bucket, join(step_key, f"params/{COMMIT_MARKER}"), b"")  # item-level marker, as Orbax writes
    gcs.write(bucket, join(step_key, "meta.json"), json.dumps({"step": step, "workers": env.processes}))
    if int(hp.get("slow_commit_step", -1)) == step:
        time.sleep(float(hp.get("commit_delay_s", 0.0)))
    gcs.write(bucket, join(step_key, COMMIT_MARKER), b"")  # last: this commits the step
    print(f"worker {env.process_id}: committed step {step}", flush=True)
    return True


def restore(gcs: Gcs, env: JobEnv, step: int) -> np.ndarray:
    """The parameters of a committed step, from every worker's part."""
    bucket, root = split_gs(env.checkpoint_dir)
    head = join(root, f"{step}/params/part-") if root else f"{step}/params/part-"
    names = sorted(i["name"] for i in gcs.list_objects(bucket, head))
    parts = [np.load(io.BytesIO(gcs.read(bucket, n)), allow_pickle=False) for n in names]
    if not parts:
        raise SystemExit(f"reference trainer: step {step} has no parameter parts under gs://{bucket}/{head}")
    return np.concatenate(parts)


def _progress(path: Path | None, step: int) -> None:
    if path is None:
        return
    tmp = path.with_suffix(".tmp")
    tmp.write_text(f"{step}\n")
    os.replace(tmp, path)


def agree_on_step(gcs: Gcs, env: JobEnv, step: int, deadline: float) -> int | None:
    """Every worker's step at SIGTERM → the highest (all train up to it, then save it); None on timeout."""
    if env.processes == 1:
        return step
    bucket, root = split_gs(env.checkpoint_dir)
    head = join(root, "_preemption", env.incarnation or "0")
    gcs.write_json(bucket, join(head, f"worker-{env.process_id}.json"), {"worker": env.process_id, "step": step})
    while time.monotonic() < deadline:
        steps = [d["step"] for d in gcs.list_json(bucket, head) if isinstance(d, dict) and "step" in d]
        if len(steps) >= env.processes:
            return int(max(steps))
        time.sleep(0.05)
    return None


def main() -> int:
    """Train from ``TPU_OPS_RESUME_STEP`` (or from scratch) to ``TPU_OPS_STEPS``."""
    env = job_env()
    hp = env.hyperparameters
    term: dict[str, float] = {}

    def on_term(signum: int, frame: FrameType | None) -> None:
        term.setdefault("at", time.monotonic())

    if hp.get("save_on_term", True):
        signal.signal(signal.SIGTERM, on_term)
    gcs = Gcs.from_env()
    t0 = time.time()
    x, y = load_data(gcs, env.dataset_manifest, hp)
    record(env.step_log, "data", None, t0, time.time())  # goodput: the trainer's own records (TPU_OPS_STEP_LOG)
    if env.resume_step is not None:
        t0 = time.time()
        params, start = restore(gcs, env, env.resume_step), env.resume_step
        record(env.step_log, "restore", start, t0, time.time())
        print(f"worker {env.process_id}: restored step {start}", flush=True)
    else:
        params, start = np.random.default_rng(int(hp.get("seed", 0))).normal(0, 0.1, x.shape[1] + 1), 0
        print(f"worker {env.process_id}: fresh start", flush=True)
    lr, batch = float(hp.get("learning_rate", 0.1)), int(hp.get("batch_size", 64))
    delay = float(hp.get("step_delay_s", 0))
    tokens, flops = step_work(x.shape[1], batch)
    micro = micro_batches(env, batch)
    saved, save_s = start, 0.0
    step = start
    t_mark = time.time()  # records back to back: the loop's own overhead belongs to the next step
    while step < env.steps:
        if "at" in term:
            return _save_on_term(gcs, env, hp, params, step, saved, save_s, term["at"], x, y, lr, batch, micro)
        step += 1
        if int(hp.get("fail_at_step", -1)) == step:
            print(f"worker {env.process_id}: injected failure at step {step}", file=sys.stderr, flush=True)
            return 1
        if int(hp.get("hang_at_step", -1)) == step and env.resume_step is None:
            print(f"worker {env.process_id}: injected hang at step {step}", flush=True)
            while True:
                time.sleep(3600)
        t0 = t_mark
        params = sgd_step(params, x, y, step, lr, batch, micro)
        if delay:
            time.sleep(delay)
        t_mark = time.time()
        # before the save: a committed step is always recorded
        record(env.step_log, "step", step, t0, t_mark, tokens, flops)
        if step % env.checkpoint_every == 0 or step == env.steps:
            t0 = time.monotonic()
            # A SIGTERM during the save's barrier (a slice of the job is gone) ends it: the term path saves.
            if save(gcs, env, step, params, hp, stop=lambda: "at" in term):
                saved, save_s = step, time.monotonic() - t0
                done = time.time()
                record(env.step_log, "save", step, t_mark, done)
                t_mark = done
        _progress(env.progress_file, step)
    loss = float(np.mean((x @ params[:-1] + params[-1] - y) ** 2))
    print(f"worker {env.process_id}: done at step {env.steps}, loss {loss:.6f}", flush=True)
    return 0


def _save_on_term(
    gcs: Gcs, env: JobEnv, hp: dict[str, Any], params: np.ndarray, step: int, saved: int, save_s: float,
    term_at: float, x: np.ndarray, y: np.ndarray, lr: float, batch: int, micro: int = 1,
) -> int:  # fmt: skip
    """SIGTERM: agree on a step, train up to it, save it if the grace allows; exit 143 either way."""
    deadline = term_at + env.term_grace_s
    target = agree_on_step(gcs, env, step, deadline - max(save_s, 0.5))
    if target is None or target <= saved:
        print(f"worker {env.process_id}: SIGTERM at step {step}; nothing new to save", flush=True)
        return 143
    while step < target:  # a worker behind the others catches up (steps are cheap next to a lost run)
        step += 1
        t0 = time.time()
        params = sgd_step(params, x, y, step, lr, batch, micro)
        record(env.step_log, "step", step, t0, time.time())
    if time.monotonic() + 2 * save_s > deadline:
        print(f"worker {env.process_id}: SIGTERM at step {step}; no time to save it", flush=True)
        return 143
    t0 = time.time()
    if save(gcs, env, step, params, hp, timeout=max(0.1, deadline - time.monotonic())):
        record(env.step_log, "save", step, t0, time.time())
        _progress(env.progress_file, step)
        print(f"worker {env.process_id}: SIGTERM: saved step {step}", flush=True)
    return 143


if __name__ == "__main__":
    sys.exit(main())
