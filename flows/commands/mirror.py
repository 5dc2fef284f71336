"""``tpu-ops mirror SRC DEST``: mirror an S3 prefix into GCS as a verified, pinned snapshot.

Kept light on purpose: no Prefect, and the cloud SDKs load only inside the handler, because a
daily no-change re-run should cost well under a second, process start included.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import typing
from typing import Any, Literal

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
    add_spec_flags(p)
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a summary")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.set_defaults(handler=run, fast_exit=True, keep_freed_memory=True)


POSITIONAL = ("source", "destination")


def add_spec_flags(p: argparse.ArgumentParser) -> None:
    """One flag per ``MirrorSpec`` field, its help and default taken from the field (stated once there).

    A flag left out is left out of the spec too, so the spec's own default applies. ``list`` fields
    take a repeatable singular flag (``allowed_locations`` → ``--allowed-location``), ``bool``
    fields a switch, ``Literal`` fields their choices.
    """
    from tpu_ops.specs.jobs import MirrorSpec

    for name, field in MirrorSpec.model_fields.items():
        if name in POSITIONAL:
            continue
        default = field.get_default(call_default_factory=True)
        shown = f" (default: {default})" if default not in (None, [], False) else ""
        kw: dict[str, Any] = {"dest": name, "default": argparse.SUPPRESS, "help": f"{field.description}{shown}"}
        flag = "--" + name.replace("_", "-")
        kind = field.annotation
        if kind is bool:
            p.add_argument(flag, action="store_true", **kw)
        elif typing.get_origin(kind) is list:
            one = name.removesuffix("s")
            p.add_argument(flag.removesuffix("s"), action="append", metavar=one.rsplit("_", 1)[-1].upper(), **kw)
        elif typing.get_origin(kind) is Literal:
            p.add_argument(flag, choices=[str(c) for c in typing.get_args(kind)], **kw)
        else:
            metavar = "MIB" if name.endswith("_mib") else "N" if kind is int else name.rsplit("_", 1)[-1].upper()
            p.add_argument(flag, type=int if kind is int else str, metavar=metavar, **kw)


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

    from tpu_ops.mirror.engine import mirror
    from tpu_ops.settings import Settings
    from tpu_ops.specs.jobs import MirrorSpec
    from tpu_ops.specs.loader import parse_spec

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    data = {k: v for k, v in vars(args).items() if k in MirrorSpec.model_fields}
    spec = parse_spec(MirrorSpec, data, "mirror arguments")
    bar = _Bar() if not args.no_progress and sys.stderr.isatty() else None
    try:
        result = mirror(spec, Settings.model_validate({}), progress=bar)
    finally:
        if bar:
            bar.close()
    print(json.dumps(result.to_dict()) if args.json else summary(result))
    return 0
