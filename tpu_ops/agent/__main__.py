"""``tpu-ops-agent COMMAND`` (also ``python -m tpu_ops.agent``): what the startup script runs on each worker.

Standard library only: it runs on the image's own Python 3.10+ with nothing installed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tpu_ops.agent.gcs import GcsError
from tpu_ops.agent.metadata import MetadataError


def _preflight(args: argparse.Namespace) -> int:
    from tpu_ops.agent.gcs import Gcs
    from tpu_ops.agent.metadata import Metadata
    from tpu_ops.agent.preflight import SnapshotMismatch, preflight

    md = Metadata.from_env()
    try:
        report = preflight(Gcs.from_env(metadata=md), md.identity(), args.run_id, args.manifest, args.out)
    except SnapshotMismatch as exc:
        print(f"tpu-ops agent: {exc}", file=sys.stderr)
        return 1
    print(
        f"tpu-ops agent: worker {report.worker_number}/{report.worker_count} verified snapshot "
        f"{report.snapshot_id}: {report.objects_checked} objects, {report.bytes_checked} bytes"
    )
    if args.done_file:
        args.done_file.parent.mkdir(parents=True, exist_ok=True)
        args.done_file.touch()
    return 0


def _run(args: argparse.Namespace) -> int:
    from tpu_ops.agent.warm import warm_trainer

    # First: a Python-entry-point trainer starts importing now, while the agent reads GCS.
    job_file = args.job_file.resolve() if args.job_file else None
    warm = warm_trainer(job_file, job_file.parent / "trainer.log") if job_file else None
    try:
        from tpu_ops.agent.run import run

        return run(args.job, args.incarnation, warm)
    finally:
        if warm is not None and warm.poll() is None and warm.stdin and not warm.stdin.closed:
            warm.kill()  # the agent failed before handing it an environment


def _fetch(args: argparse.Namespace) -> int:
    from tpu_ops.agent.gcs import Gcs

    written = Gcs.from_env().download_prefix(args.source, args.dest)
    print(f"tpu-ops agent: fetched {len(written)} objects from {args.source} into {args.dest}")
    return 0 if written or args.allow_empty else 1


def main(argv: list[str] | None = None) -> int:
    """Run one agent command; its exit status is the worker's."""
    parser = argparse.ArgumentParser(prog="tpu-ops-agent")
    sub = parser.add_subparsers(dest="command", required=True)
    pre = sub.add_parser("preflight", help="verify the pinned dataset snapshot from this worker")
    pre.add_argument("--run-id", required=True)
    pre.add_argument("--manifest", required=True, help="gs:// URI of the snapshot manifest")
    pre.add_argument("--out", required=True, help="gs:// prefix for the per-worker reports")
    pre.add_argument("--done-file", type=Path, help="created on success")
    pre.set_defaults(handler=_preflight)
    run = sub.add_parser("run", help="resume and run the job's trainer on this worker (the training agent)")
    run.add_argument("--job", required=True, help="gs:// URI of the run's _tpu_ops/job.json")
    run.add_argument("--incarnation", default="0", help="which provisioning of the slice this is")
    run.add_argument("--job-file", type=Path, help="a local copy of the job spec (the bootstrap fetches it)")
    run.set_defaults(handler=_run)
    fetch = sub.add_parser("fetch", help="copy gs://bucket/prefix/ into a local directory (for setup commands)")
    fetch.add_argument("source", help="gs:// prefix, e.g. a wheelhouse or a Python runtime the user uploaded")
    fetch.add_argument("dest", help="local directory")
    fetch.add_argument("--allow-empty", action="store_true", help="succeed when nothing is under the prefix")
    fetch.set_defaults(handler=_fetch)
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args))
    except (GcsError, MetadataError, ValueError, OSError) as exc:
        print(f"tpu-ops agent: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


def console() -> None:
    """Entry point of the ``tpu-ops-agent`` console script."""
    sys.exit(main())


if __name__ == "__main__":
    sys.exit(main())
