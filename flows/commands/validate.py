"""``tpu-ops validate FILE``: check a spec file and print every error."""

from __future__ import annotations

import argparse
import json
import sys

from pydantic import BaseModel

from tpu_ops.errors import SpecError
from tpu_ops.specs import ExportSpec, MirrorSpec, PipelineSpec, ProvisionSpec, TrainSpec, load_spec

KINDS: dict[str, type[BaseModel]] = {
    "pipeline": PipelineSpec,
    "mirror": MirrorSpec,
    "provision": ProvisionSpec,
    "train": TrainSpec,
    "export": ExportSpec,
}


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("validate", help="Check a spec file (YAML or JSON) and print its errors.")
    p.add_argument("files", nargs="+", metavar="FILE", help="spec files to check")
    p.add_argument("--kind", choices=sorted(KINDS), default="pipeline", help="what the file holds")
    p.add_argument("--json", action="store_true", help="print errors as JSON")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    failed = 0
    for path in args.files:
        try:
            load_spec(path, KINDS[args.kind])
        except SpecError as exc:
            failed += 1
            if args.json:
                print(json.dumps({"file": path, "ok": False, "errors": exc.errors}, default=str))
            else:
                print(f"{exc}", file=sys.stderr)
        else:
            print(json.dumps({"file": path, "ok": True}) if args.json else f"{path}: ok")
    return 1 if failed else 0
