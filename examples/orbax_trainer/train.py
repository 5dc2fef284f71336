"""A JAX + orbax-checkpoint trainer run as ``train.command`` (docs/orbax-trainer.md, the job contract).

It uses nothing of tpu-ops: the job contract's variables, ``jax.distributed`` initialised over every
process of every slice (``TPU_OPS_PROCESS_ID``/``TPU_OPS_PROCESSES``/``TPU_OPS_COORDINATOR_ADDRESS``),
and an Orbax ``CheckpointManager`` writing to ``TPU_OPS_CHECKPOINT_DIR`` (a ``gs://`` URI; on the local
stack TensorStore reaches the GCS emulator through ``TENSORSTORE_GCS_HTTP_URL``, which the host passes
to every worker).

The model: parameters ``w`` (one global ``jax.Array``) fitted to a global batch of random targets per
step, loss ``Σ_j ½‖w - t_j‖² / batch``. The targets depend only on the step and the example, so the
arithmetic does not depend on where the run is interrupted, and the parameter count and global batch
do not depend on the shape. The mesh is ``(slice, host)``: the batch is split over every process
(data parallel, across slices over DCN), ``w`` is sharded over the hosts of a slice and replicated
across slices, as multislice training lays it out. On CPU, JAX's distributed runtime (Gloo
collectives between processes) stands in for ICI and DCN alike.

Elastic shapes: with ``TPU_OPS_ACCUM_STEPS`` = k the trainer splits the global batch into k
micro-batches and sums their gradients before one optimizer step, so a step on 1/k of the target's
chips is the target's step (equal up to float summation order). The checkpoint holds only the global
``w``; a restore reads it onto the current mesh from this run's shardings, whatever mesh saved it.

Preemption: JAX's preemption service turns SIGTERM on any host into a sync point every process
agrees on; ``CheckpointManager.save`` saves that step even when it is not due, and once
``reached_preemption(step)`` the trainer waits for the save and exits 143. When done, process 0
writes the whole of ``w`` to ``<checkpoint dir>/result/params.npy`` (what the tests compare). Its step,
save and restore records go to ``TPU_OPS_STEP_LOG`` (JSON lines) for the goodput report.

Hyperparameters (``TPU_OPS_HYPERPARAMETERS``): ``size`` (parameters per process of the target shape),
``batch`` (the global batch, default 4), ``learning_rate``, ``seed``, ``step_delay_s``.
"""

from __future__ import annotations

import io
import json
import os
import sys
import time

import jax
import numpy as np

# CPU processes run collectives (the gradient's reduction, Orbax's barriers) through Gloo.
jax.config.update("jax_platforms", "cpu")
jax.config.update("jax_cpu_collectives_implementation", "gloo")
# Random targets equal however they are sharded (the default since JAX 0.5; pinned: the result relies on it)
jax.config.update("jax_threefry_partitionable", True)

import jax.numpy as jnp  # noqa: E402
import orbax.checkpoint as ocp  # noqa: E402
from etils import epath  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402


def _var(env: os._Environ[str] | dict[str, str], name: str, jax_name: str = "", default: str = "") -> str:
    """``TPU_OPS_<name>``, else the ``JAX_*`` twin (older agents), else ``default``."""
    return env.get("TPU_OPS_" + name) or (env.get(jax_name) if jax_name else None) or default


def _record(kind: str, step: int, start: float) -> None:
    """One goodput record (the job contract's ``TPU_OPS_STEP_LOG``); none without the variable."""
    path = os.environ.get("TPU_OPS_STEP_LOG")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"kind": kind, "step": step, "start": start, "end": time.time()}) + "\n")


def main() -> int:
    env = os.environ
    processes = int(_var(env, "PROCESSES", "JAX_NUM_PROCESSES", "1"))
    process_id = int(_var(env, "PROCESS_ID", "JAX_PROCESS_ID", "0"))
    slices = int(_var(env, "SLICES", default="1"))
    accum = int(_var(env, "ACCUM_STEPS", default="1"))
    chips, target_chips = int(_var(env, "CHIPS", default="0")), int(_var(env, "TARGET_CHIPS", default="0"))
    if accum < 1:
        raise SystemExit(f"TPU_OPS_ACCUM_STEPS={accum} is below 1")
    if processes % slices:
        raise SystemExit(f"TPU_OPS_PROCESSES={processes} do not split over TPU_OPS_SLICES={slices}")
    if chips and target_chips and chips * accum != target_chips:  # the agent's promise: target = chips * k
        raise SystemExit(f"TPU_OPS_ACCUM_STEPS={accum} does not take {chips} chips to {target_chips}")
    hp = json.loads(env.get("TPU_OPS_HYPERPARAMETERS") or "{}")
    size, lr, seed = int(hp.get("size", 1024)), float(hp.get("learning_rate", 0.1)), int(hp.get("seed", 0))
    batch, delay = int(hp.get("batch", 4)), float(hp.get("step_delay_s", 0.0))
    steps, every = int(env["TPU_OPS_STEPS"]), int(env["TPU_OPS_CHECKPOINT_EVERY"])
    progress = env.get("TPU_OPS_PROGRESS_FILE")
    if batch % (processes * accum):
        raise SystemExit(f"batch {batch} does not split into {accum} micro-batches over {processes} processes")
    jax.distributed.initialize(
        coordinator_address=_var(env, "COORDINATOR_ADDRESS", "JAX_COORDINATOR_ADDRESS"),
        num_processes=processes,
        process_id=process_id,
    )
    params = size * processes * accum  # the target shape's count, whatever shape this is
    micro = batch // accum

    # Process ids run slice by slice (the job contract), so rows of this grid are slices.
    devices = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
    mesh = Mesh(np.array(devices).reshape(slices, -1), ("slice", "host"))
    w_sharding = NamedSharding(mesh, P("host"))  # sharded within a slice, replicated across slices
    data_sharding = NamedSharding(mesh, P(("slice", "host"), None))  # every process its rows of the batch

    def loss(w: jax.Array, targets: jax.Array) -> jax.Array:
        return 0.5 * jnp.sum(jnp.square(w[None, :] - targets)) / batch  # over the global batch, not the micro

    @jax.jit
    def grad(w: jax.Array, step: jax.Array, first: jax.Array) -> jax.Array:
        rows = first + jnp.arange(micro, dtype=jnp.uint32)
        key = jax.random.fold_in(jax.random.key(seed), step)
        targets = jax.vmap(lambda j: jax.random.normal(jax.random.fold_in(key, j), (params,)))(rows)
        targets = jax.lax.with_sharding_constraint(targets, data_sharding)
        return jax.lax.with_sharding_constraint(jax.grad(loss)(w, targets), w_sharding)

    add = jax.jit(lambda a, b: a + b, donate_argnums=0)
    update = jax.jit(lambda w, g: w - lr * g, donate_argnums=0)

    manager = ocp.CheckpointManager(
        env["TPU_OPS_CHECKPOINT_DIR"], options=ocp.CheckpointManagerOptions(save_interval_steps=every)
    )
    resume = env.get("TPU_OPS_RESUME_STEP")
    if resume is not None:
        t0 = time.time()
        # the target shardings of *this* mesh: Orbax reads each process's part, whatever mesh wrote it
        abstract = {"w": jax.ShapeDtypeStruct((params,), jnp.float32, sharding=w_sharding)}
        w = manager.restore(int(resume), args=ocp.args.StandardRestore(abstract))["w"]
        start = int(resume)
        _record("restore", start, t0)
        print(f"process {process_id}: restored step {start}", flush=True)
    else:
        w = jax.jit(lambda: jnp.zeros((params,), jnp.float32), out_shardings=w_sharding)()
        start = 0
    # libtpu reads MEGASCALE_* to join slices over DCN; on CPU the distributed runtime does it (shown, not read)
    print(f"process {process_id} of {processes}, slice {_var(env, 'SLICE', default='0')} of {slices} "
          f"(MEGASCALE_NUM_SLICES={env.get('MEGASCALE_NUM_SLICES', '-')}): {params} parameters, "
          f"batch {batch} in {accum} micro-batch(es)", flush=True)  # fmt: skip

    for i in range(start + 1, steps + 1):
        t0 = time.time()
        step = np.uint32(i)
        g = grad(w, step, np.uint32(0))
        for m in range(1, accum):  # the same optimizer step as the target shape's, on fewer chips
            g = add(g, grad(w, step, np.uint32(m * micro)))
        w = update(w, g)
        w.block_until_ready()
        if delay:  # stands in for a real step's compute
            time.sleep(delay)
        _record("step", i, t0)
        if progress:
            with open(progress, "w") as f:
                f.write(str(i))
        # Saves every `every` steps, and at the preemption sync point whatever the step.
        t0 = time.time()
        if manager.save(i, args=ocp.args.StandardSave({"w": w})):
            _record("save", i, t0)  # the blocking part; the upload goes on in the background
        if manager.reached_preemption(i):
            manager.wait_until_finished()
            print(f"process {process_id}: preempted, saved step {i}", flush=True)
            return 143
    manager.wait_until_finished()
    whole = multihost_utils.process_allgather(w, tiled=True)  # a collective: every process takes part
    if process_id == 0:
        buf = io.BytesIO()
        np.save(buf, np.asarray(whole))
        result = epath.Path(env["TPU_OPS_CHECKPOINT_DIR"]) / "result"
        result.mkdir(parents=True, exist_ok=True)
        (result / "params.npy").write_bytes(buf.getvalue())
    manager.close()
    print(f"process {process_id}: done at step {steps}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
