"""The dry run's proof of resumption: the reference trainer run again, uninterrupted, compared bit for bit.

After the pipeline, a run of the reference trainer (the dry run's default) is repeated as one local
process with the same steps, hyperparameters and dataset snapshot, into the emulated GCS, and its
final parameters are compared with the run's (every part, in order). Preemptions, replaced slices and
other process counts must not change a bit; a trainer that accumulates gradients over micro-batches
(elastic shapes) may differ by rounding, which ``max_rel_diff`` shows.
"""

from __future__ import annotations

import io
import subprocess
import sys
from collections.abc import Mapping
from typing import Any

REFERENCE = "tpu_ops.train.reference:main"


def _params(gcs: Any, uri: str, step: int) -> Any:
    import numpy as np

    bucket, _, prefix = uri.removeprefix("gs://").partition("/")
    head = f"{prefix.rstrip('/')}/{step}/params/part-" if prefix else f"{step}/params/part-"
    blobs = sorted(gcs.list_blobs(bucket, prefix=head), key=lambda b: b.name)
    return np.concatenate([np.load(io.BytesIO(b.download_as_bytes())) for b in blobs]) if blobs else None


def compare_with_uninterrupted(
    env: Mapping[str, str],
    gcs: Any,
    train: Any,
    run_uri: str,
    manifest: str | None,
    final_step: int | None,
    shape: Mapping[str, str] | None = None,
) -> dict[str, Any] | None:
    """Rerun the reference trainer uninterrupted and compare; None when the run used another trainer.
    ``shape``: the elastic-shape variables of the target shape (a run with ``shapes`` is compared with
    an uninterrupted run on its target)."""
    import numpy as np

    if train.command is not None or train.trainer != REFERENCE or final_step is None:
        return None
    baseline = f"{run_uri.rstrip('/')}-uninterrupted"
    hp = {k: v for k, v in train.hyperparameters.items() if k != "step_delay_s"}  # speed changes no figure
    contract = {
        "TPU_OPS_RUN_ID": "uninterrupted",
        "TPU_OPS_WORKER": "0",
        "TPU_OPS_WORKERS": "1",
        "TPU_OPS_CHECKPOINT_DIR": baseline,
        "TPU_OPS_STEPS": str(final_step),
        "TPU_OPS_CHECKPOINT_EVERY": str(final_step),
        "TPU_OPS_HYPERPARAMETERS": __import__("json").dumps(hp),
        **({"TPU_OPS_DATASET_MANIFEST": manifest} if manifest else {}),
        **(shape or {}),
    }
    # The workers' environment has no OPENBLAS_* (the host simulator passes nothing of the host's); a
    # host's OPENBLAS_CORETYPE picks other kernels, so other rounding: the baseline drops them too.
    base = {k: v for k, v in env.items() if not k.startswith("OPENBLAS_")}
    subprocess.run(
        [sys.executable, "-m", "tpu_ops.train.reference"],
        env={**base, **contract},
        check=True,
        capture_output=True,
        timeout=300,
    )
    ran, ref = _params(gcs, run_uri, final_step), _params(gcs, baseline, final_step)
    if ran is None or ref is None or ran.shape != ref.shape:
        return {"equal": False, "bit_identical": False, "max_rel_diff": None, "uninterrupted": baseline}
    scale = np.maximum(np.abs(ref), np.finfo(ref.dtype).tiny)
    return {
        "equal": bool(np.array_equal(ran, ref)),
        "bit_identical": ran.tobytes() == ref.tobytes(),
        "max_rel_diff": float(np.max(np.abs(ran - ref) / scale)),
        "uninterrupted": baseline,
    }
