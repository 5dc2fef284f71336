"""A failure reads as its message: no class names (``TpuOpsError: ValueError: ...``) on the line a
person reads, unless the exception is a bug (an unexpected ``KeyError``), which says so."""

from __future__ import annotations

import argparse

import pytest

from flows.cli import _call
from flows.failures import one_line
from tpu_ops.errors import NotFoundError, TrainingError

HINT = " (run with --debug for the traceback)"


def _failing(exc: BaseException) -> argparse.Namespace:
    def handler(_args: argparse.Namespace) -> int:
        raise exc

    return argparse.Namespace(command="validate", handler=handler, debug=False)


@pytest.mark.parametrize(
    ("exc", "line"),
    [
        (ValueError("checkpoint_dir: give the training checkpoint_dir"),
         "error: checkpoint_dir: give the training checkpoint_dir" + HINT),
        (OSError("disk full"), "error: disk full" + HINT),
        (TrainingError("worker 1: trainer exited 3"), "error: worker 1: trainer exited 3"),
        (NotFoundError("gcs: 404 GET /b/acme: not found", status=404), "error: gcs: 404 GET /b/acme: not found"),
        (KeyError("slice"), "error: unexpected KeyError: 'slice' (a bug in tpu-ops, please report it)" + HINT),
    ],
)  # fmt: skip
def test_the_line_is_the_message(exc: BaseException, line: str) -> None:
    assert one_line(exc) == line


def test_the_command_line_prints_no_class_name(capsys: pytest.CaptureFixture[str]) -> None:
    assert _call(_failing(ValueError("--spec: not a pipeline spec"))) == 1
    err = capsys.readouterr().err.strip()
    assert err == "error: --spec: not a pipeline spec" + HINT
    assert "TpuOpsError" not in err and "ValueError" not in err
