"""A JAX + orbax-checkpoint trainer run as ``train.command`` (README, "Training", the job contract).

It uses nothing of tpu-ops: the job contract's variables, ``jax.distributed`` initialised from the
coordinator variables, and an Orbax ``CheckpointManager`` writing to ``TPU_OPS_CHECKPOINT_DIR`` (a
``gs://`` URI; on the local stack TensorStore reaches the GCS emulator through
``TENSORSTORE_GCS_HTTP_URL``, which the host passes to every worker). Each process owns one shard of
the parameters (a global ``jax.Array`` sharded over every process's device), updates it with a jitted
SGD step on a quadratic loss whose targets depend only on the step and the shard, so the final
parameters are bit-identical however often the run is interrupted and resumed.

Preemption: JAX's preemption service turns SIGTERM on any host into a sync point every process
agrees on; ``CheckpointManager.save`` saves that step even when it is not due, and once
``reached_preemption(step)`` the trainer waits for the save and exits 143. When done, every process
writes its final shard to ``<checkpoint dir>/result/shard-<i>.npy`` (what the test compares). Its
step, save and restore records go to ``TPU_OPS_STEP_LOG`` (JSON lines) for the goodput report.

Hyperparameters (``TPU_OPS_HYPERPARAMETERS``): ``size`` (parameters per process), ``learning_rate``,
``seed``, ``step_delay_s``.
"""

from __future__ import annotations

import io
import json
import os
import sys
import time

import jax
import numpy as np

# CPU processes agree on barriers (Orbax's sync_global_devices) through Gloo collectives.
jax.config.update("jax_platforms", "cpu")
jax.config.update("jax_cpu_collectives_implementation", "gloo")

import jax.numpy as jnp  # noqa: E402
import orbax.checkpoint as ocp  # noqa: E402
from etils import epath  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec  # noqa: E402


def _step_fn(lr: float, seed: int, shard: int):  # type: ignore[no-untyped-def]
    @jax.jit
    def step(w: jax.Array, i: jax.Array) -> jax.Array:
        key = jax.random.fold_in(jax.random.fold_in(jax.random.key(seed), i), shard)
        target = jax.random.normal(key, w.shape, w.dtype)
        return w - lr * (w - target)  # the gradient of ½‖w - target‖²

    return step


def _record(kind: str, step: int, start: float) -> None:
    """One goodput record (README, the job contract's ``TPU_OPS_STEP_LOG``); none without the variable."""
    path = os.environ.get("TPU_OPS_STEP_LOG")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"kind": kind, "step": step, "start": start, "end": time.time()}) + "\n")


def main() -> int:
    env = os.environ
    jax.distributed.initialize(
        coordinator_address=env["JAX_COORDINATOR_ADDRESS"],
        num_processes=int(env["JAX_NUM_PROCESSES"]),
        process_id=int(env["JAX_PROCESS_ID"]),
    )
    hp = json.loads(env.get("TPU_OPS_HYPERPARAMETERS") or "{}")
    size, lr, seed = int(hp.get("size", 1024)), float(hp.get("learning_rate", 0.1)), int(hp.get("seed", 0))
    delay = float(hp.get("step_delay_s", 0.0))
    steps, every = int(env["TPU_OPS_STEPS"]), int(env["TPU_OPS_CHECKPOINT_EVERY"])
    progress = env.get("TPU_OPS_PROGRESS_FILE")

    mesh = Mesh(np.array(jax.devices()), ("x",))
    sharding = NamedSharding(mesh, PartitionSpec("x"))
    local = jax.local_devices()[0]
    shard = list(mesh.devices.flat).index(local)
    shape = (size * jax.process_count(),)
    step_fn = _step_fn(lr, seed, shard)

    def to_global(w: jax.Array) -> jax.Array:
        return jax.make_array_from_single_device_arrays(shape, sharding, [w])

    manager = ocp.CheckpointManager(
        env["TPU_OPS_CHECKPOINT_DIR"], options=ocp.CheckpointManagerOptions(save_interval_steps=every)
    )
    resume = env.get("TPU_OPS_RESUME_STEP")
    if resume is not None:
        t0 = time.time()
        abstract = {"w": jax.ShapeDtypeStruct(shape, jnp.float32, sharding=sharding)}
        restored = manager.restore(int(resume), args=ocp.args.StandardRestore(abstract))
        w = restored["w"].addressable_shards[0].data
        start = int(resume)
        _record("restore", start, t0)
        print(f"process {jax.process_index()}: restored step {start}", flush=True)
    else:
        w = jax.device_put(jnp.zeros((size,), jnp.float32), local)
        start = 0

    for i in range(start + 1, steps + 1):
        t0 = time.time()
        w = step_fn(w, jnp.asarray(i, jnp.uint32))
        w.block_until_ready()
        if delay:  # stands in for a real step's compute
            time.sleep(delay)
        _record("step", i, t0)
        if progress:
            with open(progress, "w") as f:
                f.write(str(i))
        # Saves every `every` steps, and at the preemption sync point whatever the step.
        t0 = time.time()
        if manager.save(i, args=ocp.args.StandardSave({"w": to_global(w)})):
            _record("save", i, t0)  # the blocking part; the upload goes on in the background
        if manager.reached_preemption(i):
            manager.wait_until_finished()
            print(f"process {jax.process_index()}: preempted, saved step {i}", flush=True)
            return 143
    manager.wait_until_finished()
    buf = io.BytesIO()
    np.save(buf, np.asarray(w))
    result = epath.Path(env["TPU_OPS_CHECKPOINT_DIR"]) / "result"
    result.mkdir(parents=True, exist_ok=True)
    (result / f"shard-{shard}.npy").write_bytes(buf.getvalue())
    manager.close()
    print(f"process {jax.process_index()}: done at step {steps}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
