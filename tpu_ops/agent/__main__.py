"""``python -m tpu_ops.agent COMMAND``: what the startup script runs on each worker."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tpu_ops.errors import TpuOpsError
from tpu_ops.settings import Settings


def main(argv: list[str] | None = None) -> int:
    """Run one agent command; exit 0 and create ``--done-file`` on success."""
    parser = argparse.ArgumentParser(prog="python -m tpu_ops.agent")
    sub = parser.add_subparsers(dest="command", required=True)
    pre = sub.add_parser("preflight", help="verify the pinned dataset snapshot from this worker")
    pre.add_argument("--run-id", required=True)
    pre.add_argument("--manifest", required=True, help="gs:// URI of the snapshot manifest")
    pre.add_argument("--out", required=True, help="gs:// prefix for the per-worker reports")
    for p in (pre,):
        p.add_argument("--done-file", type=Path, help="created on success (the startup script passes it)")
    args = parser.parse_args(argv)
    try:
        from tpu_ops.agent.preflight import preflight

        report = preflight(Settings(), args.run_id, args.manifest, args.out)
    except TpuOpsError as exc:
        print(f"tpu-ops agent: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(
        f"tpu-ops agent: worker {report.worker_number}/{report.worker_count} verified snapshot "
        f"{report.snapshot_id}: {report.objects_checked} objects, {report.bytes_checked} bytes"
    )
    if args.done_file:
        args.done_file.parent.mkdir(parents=True, exist_ok=True)
        args.done_file.touch()
    return 0


if __name__ == "__main__":
    sys.exit(main())
