"""``tpu-ops export``: a run's model into S3 as model.tar.gz, registered as a SageMaker model package."""

from __future__ import annotations

import argparse
from typing import Any

from flows.commands._common import show
from tpu_ops.errors import SpecError


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    e = sub.add_parser(
        "export",
        help="Package a run's final checkpoint as model.tar.gz in S3 and register a SageMaker model package.",
        description="Streams RUN/export/ (if the trainer committed it) or the newest complete checkpoint step "
        "from GCS to s3://DESTINATION/RUN_ID/model.tar.gz (multipart, write-once, verified), then registers a "
        "model package (PendingManualApproval) whose metadata names the dataset snapshot, run, step, artifact "
        "sha256 and audit head. --spec is a pipeline spec, or an export spec whose `checkpoint` is the training "
        "checkpoint_dir.",
    )
    e.add_argument("--spec", required=True, metavar="FILE", help="a pipeline or export spec (YAML or JSON)")
    e.add_argument("--run-id", required=True, help="the training run to export")
    e.add_argument("--manifest", metavar="GS_URI", help="the dataset manifest (default: the run's job.json)")
    e.add_argument("--json", action="store_true", help="print the result as JSON")
    e.add_argument("--no-flow", action="store_true", help="call the library directly (no Prefect API needed)")
    e.set_defaults(handler=run_export)


def load_export_spec(path: str) -> tuple[Any, str, str | None]:
    """(ExportSpec, checkpoint_dir, manifest) from a pipeline spec or an export spec file."""
    from pathlib import Path

    from tpu_ops.specs import ExportSpec, PipelineSpec
    from tpu_ops.specs.loader import parse_spec, read_document

    doc = read_document(Path(path))
    if isinstance(doc, dict) and "export" in doc and "train" in doc:
        pipe = parse_spec(PipelineSpec, doc, path)
        return pipe.export, pipe.train.checkpoint_dir, pipe.train.dataset_manifest
    spec = parse_spec(ExportSpec, doc, path)
    if not spec.checkpoint:
        raise SpecError(f"{path}: checkpoint: an export spec needs the training checkpoint_dir (gs://...)")
    return spec, spec.checkpoint, None


def run_export(args: argparse.Namespace) -> int:
    from tpu_ops.layout import check_run_id

    spec, base, manifest = load_export_spec(args.spec)
    run_id = check_run_id(args.run_id)
    manifest = args.manifest or manifest
    if args.no_flow:
        from flows.settings import resolve_settings
        from tpu_ops.export.steps import export
        from tpu_ops.run import Run

        run = Run.open(run_id, resolve_settings(), checkpoint_dir=base)
        try:
            result = export(run, spec, manifest)
        finally:
            run.audit.digest()
    else:
        from flows.export import export_model

        result = export_model(spec, run_id, base, manifest)
    art = result["artifact"]
    verb = "registered" if result["package_created"] else "already registered"
    status = result.get("package_status") or "PendingManualApproval"
    text = (
        f"run {run_id}: {art['uri']} ({art['size']} bytes, sha256 {art['sha256']}"
        f"{', adopted' if art['adopted'] else ''}) from {result['source']['uri']}\n"
        f"model package {result['package_arn']} {verb} ({status}"
        f"{' until approved' if status == 'PendingManualApproval' else ''})"
    )
    if not result.get("manifest_uri"):
        text += "\ndataset: none recorded (the run's train spec had no dataset_manifest)"
    show(result, args.json, text)
    return 0
