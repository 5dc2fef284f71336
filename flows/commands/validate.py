"""``tpu-ops validate FILE``: check a spec file and print every error."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pydantic import BaseModel

# Spec classes by kind, imported in the handler: pydantic models cost ~0.1 s to build, and every
# `tpu-ops` invocation registers this module.
KINDS = ("export", "mirror", "pipeline", "provision", "train", "train-job")


def spec_class(kind: str) -> type[BaseModel]:
    """The spec model for ``kind``."""
    from tpu_ops import specs

    table: dict[str, type[BaseModel]] = {
        "pipeline": specs.PipelineSpec,
        "mirror": specs.MirrorSpec,
        "provision": specs.ProvisionSpec,
        "train": specs.TrainSpec,
        "train-job": specs.TrainJobSpec,
        "export": specs.ExportSpec,
    }
    return table[kind]


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("validate", help="Check a spec file (YAML or JSON) and print its errors.")
    p.add_argument("files", nargs="+", metavar="FILE", help="spec files to check")
    p.add_argument("--kind", choices=KINDS, default="pipeline", help="what the file holds")
    p.add_argument("--json", action="store_true", help="print errors as JSON")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from tpu_ops.errors import SpecError
    from tpu_ops.specs import load_spec

    failed = 0
    for path in args.files:
        try:
            load_spec(path, spec_class(args.kind))
        except SpecError as exc:
            failed += 1
            if args.json:
                print(json.dumps({"file": path, "ok": False, "errors": exc.errors}, default=str))
            else:
                print(f"{exc}", file=sys.stderr)
        else:
            print(json.dumps({"file": path, "ok": True}) if args.json else f"{path}: ok")
    return 1 if failed else 0
