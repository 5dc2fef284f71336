"""Mirror S3 → GCS as a validated, pinned, incremental, verified snapshot committed by a manifest.

Entry point: :func:`tpu_ops.mirror.engine.mirror` (``mirror(spec, settings, progress=None)``),
returning a :class:`tpu_ops.mirror.records.MirrorResult`. Stages, one module each: ``listing``
(source once, pinned; destination once, with metadata), ``plan`` (pure copy/skip decision),
``schema``/``validate`` (safetensors headers via ranged GETs), ``strategies`` + ``scheduler`` (how
each object is copied, streamed and verified, on a bounded pool), ``sts`` (the same copies by Storage
Transfer Service), ``manifest`` (written last). Importing this package imports no cloud SDK.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tpu_ops.mirror.engine import mirror
    from tpu_ops.mirror.records import MirrorResult, Progress

__all__ = ["MirrorResult", "Progress", "mirror"]


def __getattr__(name: str) -> Any:
    if name == "mirror":
        from tpu_ops.mirror.engine import mirror

        return mirror
    if name in ("MirrorResult", "Progress"):
        from tpu_ops.mirror import records

        return getattr(records, name)
    raise AttributeError(name)
