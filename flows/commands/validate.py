"""``tpu-ops validate FILE...``: check spec files, recognising what each one is, and print every error.

A file's kind is, in order: ``--kind``; what its first comment line declares (``# kind: pipeline ...``,
as every example does); what its top-level keys look like. A directory is checked file by file.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pydantic import BaseModel

# Spec classes by kind, imported in the handler: pydantic models cost ~0.1 s to build, and every
# `tpu-ops` invocation registers this module.
KINDS = ("export", "mirror", "pipeline", "provision", "train", "train-job")
AUTOMATION = "prefect-automation"  # not a tpu-ops spec: `prefect automation create` checks it
WHAT = {
    "pipeline": "a pipeline spec (tpu-ops serve / dry-run / the retraining-pipeline form)",
    "train-job": "a train job spec (tpu-ops train --spec)",
    "provision": "a provision spec (tpu-ops provision --spec, cost --spec)",
    "mirror": "a mirror spec (the mirror-dataset form; tpu-ops mirror takes the same fields as flags)",
    "train": "the train section of a job",
    "export": "an export spec (tpu-ops export --spec)",
    AUTOMATION: "a Prefect automation (prefect automation create --from-file)",
}
DECLARED = re.compile(r"^#\s*kind:\s*([a-z-]+)", re.IGNORECASE)
SUFFIXES = (".yaml", ".yml", ".json")


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
    p = sub.add_parser(
        "validate",
        help="Check spec files (YAML or JSON) of any kind and print their errors.",
        description="Each file's kind is --kind, else what its first comment line declares "
        "(`# kind: pipeline`), else what its keys look like: "
        + "; ".join(f"{k}: {v}" for k, v in WHAT.items())
        + ". A directory is checked file by file (*.yaml, *.yml, *.json).",
    )
    p.add_argument("files", nargs="+", metavar="FILE", help="spec files or directories to check")
    p.add_argument("--kind", choices=KINDS, help="what every file holds (default: recognised per file)")
    p.add_argument("--json", action="store_true", help="print one JSON object per file")
    p.set_defaults(handler=run)


def declared_kind(path: Path) -> str | None:
    """The kind a file's first comment line declares (``# kind: KIND``), if it does."""
    try:
        with path.open(encoding="utf-8", errors="replace") as f:
            head = [line.strip() for _, line in zip(range(20), f, strict=False)]
    except OSError:
        return None
    first = next((line for line in head if line.startswith("#")), None)
    found = DECLARED.match(first) if first else None
    return found.group(1).lower() if found else None


def looks_like(doc: Any) -> str | None:
    """The kind whose fields best match ``doc``'s top-level keys (None when nothing matches)."""
    if not isinstance(doc, dict) or not doc:
        return None
    if "automations" in doc:
        return AUTOMATION
    keys = set(doc)
    best: tuple[int, int, str] | None = None
    for kind in KINDS:
        model = spec_class(kind)
        fields = set(model.model_fields)
        known, unknown = len(keys & fields), len(keys - fields)
        required = sum(1 for n, f in model.model_fields.items() if f.is_required() and n not in keys)
        score = (known - 2 * unknown, -required, kind)
        if known and (best is None or score[:2] > best[:2]):
            best = score
    return best[2] if best else None


def _files(args: list[str]) -> list[Path]:
    out: list[Path] = []
    for name in args:
        path = Path(name)
        if path.is_dir():  # its spec files; the directory itself when it has none (run() says so)
            out += sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in SUFFIXES) or [path]
        else:
            out.append(path)
    return out


def check(path: Path, kind: str | None) -> tuple[str | None, list[dict[str, Any]], str]:
    """``(kind, errors, message)`` for one file: the kind it was checked as, and what is wrong with it
    (for a valid file, ``message`` holds its notes: names read as others, one a line)."""
    from tpu_ops.errors import SpecError
    from tpu_ops.specs import parse_spec
    from tpu_ops.specs.loader import read_document

    try:
        doc = read_document(path)
    except SpecError as exc:
        return kind, exc.errors or [{"field": "(document)", "message": str(exc), "value": None}], str(exc)
    seems = looks_like(doc)
    kind = kind or declared_kind(path) or seems
    if kind == AUTOMATION:
        return kind, [], ""
    if kind not in KINDS:
        hint = f" (it declares kind {kind!r}; kinds: {', '.join(KINDS)})" if kind else ""
        msg = f"{path}: not a tpu-ops spec I recognise{hint}; pass --kind {'|'.join(KINDS)}"
        return None, [{"field": "(document)", "message": msg, "value": None}], msg
    try:
        spec = parse_spec(spec_class(kind), doc, what=f"{path}: {kind} spec")
    except SpecError as exc:
        msg = str(exc)
        if seems and seems != kind:
            msg += f"\n  (its keys look like a {seems} spec: try --kind {seems})"
        return kind, exc.errors, msg
    over = over_budget(spec)
    if over:
        field, line = over
        return kind, [{"field": field, "message": line, "value": None}], f"{path}: {line}"
    return kind, [], "\n".join(f"  note: {n}" for n in alias_notes(doc))


def alias_notes(doc: Any, where: str = "") -> list[str]:
    """``FIELD: 'v5e-16' is read as 'v5litepod-16' ...`` for each accelerator alias in ``doc``."""
    from tpu_ops.accelerators import alias_note

    if isinstance(doc, list):
        return [n for i, item in enumerate(doc) for n in alias_notes(item, f"{where}[{i}]")]
    if not isinstance(doc, dict):
        return []
    notes = []
    for key, value in doc.items():
        path = f"{where}.{key}" if where else str(key)
        note = alias_note(value) if key == "accelerator_type" and isinstance(value, str) else ""
        notes += [f"{path}: {note}"] if note else alias_notes(value, path)
    return notes


def over_budget(spec: Any) -> tuple[str, str] | None:
    """``(field, one line)`` when a spec that provisions would be refused for its budget, else None."""
    from flows.budget import refusal

    provision = getattr(spec, "provision", None)
    field = "provision.budget_usd"
    if provision is None and hasattr(spec, "budget_usd"):  # a provision spec: the budget is top-level
        provision, field = spec, "budget_usd"
    if provision is None:
        return None
    line = refusal(provision, field)
    return (field, line) if line else None


def run(args: argparse.Namespace) -> int:
    failed = 0
    for path in _files(args.files):
        if path.is_dir():  # `validate examples/*` reaches examples/orbax_trainer/: say why nothing is checked
            empty = f"a directory with no spec file ({', '.join(SUFFIXES)}) in it: nothing to check"
            print(json.dumps({"file": str(path), "kind": None, "ok": True, "errors": [], "notes": [empty]})
                  if args.json else f"{path}: {empty}")  # fmt: skip
            continue
        kind, errors, message = check(path, args.kind)
        ok = not errors
        failed += not ok
        if args.json:
            notes = [n.removeprefix("  note: ") for n in message.splitlines()] if ok else []
            print(
                json.dumps({"file": str(path), "kind": kind, "ok": ok, "errors": errors, "notes": notes}, default=str)
            )
        elif ok:
            print(f"{path}: ok, {WHAT.get(kind or '', kind)}" + (f"\n{message}" if message else ""))
        else:
            print(message, file=sys.stderr)
    return 1 if failed else 0
