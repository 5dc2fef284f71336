"""``tpu-ops mirror SRC DEST``: mirror an S3 prefix into GCS as a verified, pinned snapshot.

Kept light on purpose: no Prefect, and the cloud SDKs load only inside the handler, because a
daily no-change re-run should cost well under a second, process start included.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

MiB = 1024 * 1024


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "mirror",
        help="Mirror s3://bucket/prefix to gs://bucket/prefix as a validated, verified snapshot.",
        description="Validate shards against the source's schema file, copy only what is missing or "
        "changed (pinned to the listed versions, CRC32C-verified), then commit a manifest. "
        "Prints the snapshot id and manifest URI that training pins.",
    )
    p.add_argument("source", metavar="SRC", help="s3://bucket/prefix of the curated dataset")
    p.add_argument("destination", metavar="DEST", help="gs://bucket/prefix to mirror into")
    p.add_argument("--snapshot", metavar="NAME", help="name the snapshot (names are immutable)")
    p.add_argument("--concurrency", type=int, default=8, metavar="N", help="objects/parts copied at once (8)")
    p.add_argument(
        "--ranged-min-mib",
        type=int,
        default=256,
        metavar="MIB",
        help="objects of at least this size are copied in parallel ranged parts, then composed (256)",
    )
    p.add_argument("--part-size-mib", type=int, default=32, metavar="MIB", help="size of those parts (32)")
    p.add_argument("--schema-file", default="_schema.yaml", metavar="KEY", help="schema file in SRC")
    p.add_argument(
        "--require-schema", action="store_true", help="refuse a source without its schema file (default: warn)"
    )
    p.add_argument(
        "--allowed-location",
        action="append",
        default=[],
        metavar="LOC",
        help="a GCS location the destination bucket may be in (repeatable; default: any)",
    )
    p.add_argument(
        "--engine",
        choices=("local", "sts", "auto"),
        default="local",
        help="who copies: this process, Storage Transfer Service, or STS above the settings' threshold (local)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a summary")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.set_defaults(handler=run, fast_exit=True, http_only=True, keep_freed_memory=True)


class _Bar:
    """A one-line progress bar on stderr, redrawn at most ten times a second."""

    def __init__(self) -> None:
        self._last = 0.0
        self._drawn = False

    def __call__(self, p: Any) -> None:
        now = time.monotonic()
        if p.phase == "copy" and p.objects_done < p.objects_total and now - self._last < 0.1:
            return
        self._last = now
        if p.phase == "copy" and p.bytes_total:
            frac = p.bytes_done / p.bytes_total
            bar = "#" * int(frac * 30)
            line = (
                f"copy [{bar:<30}] {frac:4.0%} {p.objects_done}/{p.objects_total} objects "
                f"{p.bytes_done / MiB:.1f}/{p.bytes_total / MiB:.1f} MiB"
            )
        elif p.phase == "done":
            line = ""
        else:
            line = f"{p.phase}..."
        sys.stderr.write("\r\x1b[K" + line)
        sys.stderr.flush()
        self._drawn = bool(line)

    def close(self) -> None:
        if self._drawn:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()


def summary(r: Any) -> str:
    """The human-readable result."""
    t = r.timings_s
    rate = r.bytes_copied / MiB / t["copy"] if t.get("copy") else 0.0
    steps = ", ".join(f"{k} {v:.2f}" for k, v in t.items() if k != "total")
    return "\n".join(
        [
            f"snapshot   {r.snapshot_id}" + (f" ({r.snapshot_name})" if r.snapshot_name else ""),
            f"manifest   {r.manifest_uri}",
            f"copied     {r.objects_copied} objects, {r.bytes_copied / MiB:.1f} MiB ({rate:.0f} MiB/s), "
            f"{r.objects_s3_checksum_verified} also checked against S3's checksum",
            f"skipped    {r.objects_skipped} objects, {r.bytes_skipped / MiB:.1f} MiB (already mirrored)",
            f"validated  {r.shards_validated} shards"
            + (f" against {r.schema_file}" if r.schema_file else " (no schema file in the source)"),
            f"time       {t['total']:.2f} s ({steps})",
        ]
    )


def run(args: argparse.Namespace) -> int:
    import logging

    if args.engine != "local" and "grpc" in sys.modules and sys.modules["grpc"] is None:
        del sys.modules["grpc"]  # the STS client's package imports its gRPC transport as well

    from tpu_ops.mirror.engine import mirror
    from tpu_ops.settings import Settings
    from tpu_ops.specs.jobs import MirrorSpec
    from tpu_ops.specs.loader import parse_spec

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    data: dict[str, Any] = {
        "source": args.source,
        "destination": args.destination,
        "snapshot": args.snapshot,
        "concurrency": args.concurrency,
        "part_size_mib": args.part_size_mib,
        "ranged_min_mib": args.ranged_min_mib,
        "schema_file": args.schema_file,
        "require_schema": args.require_schema,
        "allowed_locations": args.allowed_location,
        "engine": args.engine,
    }
    spec = parse_spec(MirrorSpec, data, "mirror arguments")
    bar = _Bar() if not args.no_progress and sys.stderr.isatty() else None
    try:
        result = mirror(spec, Settings.model_validate({}), progress=bar)
    finally:
        if bar:
            bar.close()
    print(json.dumps(result.to_dict()) if args.json else summary(result))
    return 0
