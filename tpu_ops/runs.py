"""What the controller (a flow, the CLI) reads back from a run's workers in GCS.

The workers of a run write their pre-flight reports to ``RUN/_tpu_ops/preflight/worker-<n>.json``
(``tpu_ops.layout.RunLayout.preflight``), never among the checkpoints a resume scan reads. The
agent that writes them is the workers' package (``tpu_ops.agent``); this is the other side.
"""

from __future__ import annotations

import json
from typing import Any

from tpu_ops.cloud.translate import google_errors
from tpu_ops.errors import DeadlineError, IntegrityError
from tpu_ops.polling import poll
from tpu_ops.uris import parse_gs


def collect_reports(
    gcs: Any, out_uri: str, expected: int, timeout_s: float, poll_s: float = 0.5
) -> list[dict[str, Any]]:
    """Wait until ``expected`` workers wrote their reports under ``out_uri``; return them by worker.

    Raises ``IntegrityError`` if a worker reported problems, ``DeadlineError`` if some never report.
    """
    out = parse_gs(out_uri)
    seen: list[int] = [0]

    def reports() -> list[Any] | None:
        with google_errors("gcs"):
            listed = gcs.list_blobs(out.bucket, prefix=out.key(""))
            # worker-N.json (slice 0, or the only slice) and slice-S-worker-N.json (agent.job.host_key)
            blobs = [b for b in listed if b.name.rsplit("/", 1)[-1].startswith(("worker-", "slice-"))]
            blobs = [b for b in blobs if b.name.endswith(".json")]
        seen[0] = len(blobs)
        return blobs if len(blobs) >= expected else None

    try:
        blobs = poll(reports, timeout_s=timeout_s, interval_s=poll_s, max_interval_s=poll_s, what="worker reports")
    except TimeoutError:
        raise DeadlineError(f"{seen[0]} of {expected} workers reported under {out_uri} in {timeout_s:.0f}s") from None
    with google_errors("gcs"):
        found = sorted((json.loads(b.download_as_bytes()) for b in blobs), key=lambda r: int(r["worker_number"]))
    bad = [r for r in found if r["problems"]]
    if bad:
        raise IntegrityError(f"workers {[r['worker_number'] for r in bad]} found the snapshot differs")
    return found
