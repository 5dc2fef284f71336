"""Which kind of spec a file holds, for the commands that take one (``launch``, ``provision``, ``train``).

The kind is what the file's first comment line declares (``# kind: pipeline``), else what its keys
look like (``tpu-ops validate``'s rules). A command given a spec of another kind answers one line
naming the kind and the command that runs it, instead of one "Field required" per missing field.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tpu_ops.errors import SpecError

NAMES = {"pipeline": "a pipeline spec", "train-job": "a train job spec", "provision": "a provision spec",
         "mirror": "a mirror spec", "train": "the train section of a job", "export": "an export spec"}  # fmt: skip
RUNS = {"pipeline": "tpu-ops launch {path}", "train-job": "tpu-ops launch {path}",
        "provision": "tpu-ops launch {path}", "mirror": "tpu-ops mirror SRC DEST (the mirror-dataset form)",
        "export": "tpu-ops export --spec {path}", "train": "a train job spec's train: section"}  # fmt: skip


def kind_of(path: Path) -> tuple[str | None, Any]:
    """The file's kind (None if unrecognisable) and its parsed document (``SpecError`` if unreadable)."""
    from flows.commands.validate import AUTOMATION, KINDS, declared_kind, looks_like
    from tpu_ops.specs.loader import read_document

    doc = read_document(path)
    kind = declared_kind(path) or looks_like(doc)
    if kind == AUTOMATION:
        raise SpecError(f"{path} is a Prefect automation, not a tpu-ops spec: prefect automation create --from-file")
    return (kind if kind in KINDS else None), doc


def expect_kind(path: str | Path, expected: str, command: str) -> None:
    """Refuse in one line a spec file that is recognisably of another kind than ``expected``."""
    path = Path(path)
    try:
        kind, _ = kind_of(path)
    except SpecError:
        return  # unreadable: the command's own loading says why, field by field
    if kind is None or kind == expected:
        return
    raise SpecError(
        f"{path} is {NAMES[kind]}, not {NAMES[expected]} ({command} takes one); run it with: "
        + RUNS[kind].format(path=path),
        [{"field": "(document)", "message": f"{NAMES[kind]}, expected {NAMES[expected]}", "value": kind}],
    )
