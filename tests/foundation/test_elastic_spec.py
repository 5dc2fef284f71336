"""``provision.slice.shapes``: the target first, smaller shapes whose chips divide it; refused in one line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from flows.cli import main
from tpu_ops.accelerators import parse_shape, smaller_shapes
from tpu_ops.specs import PipelineSpec, load_spec
from tpu_ops.specs.slice import SliceSpec

ROOT = Path(__file__).resolve().parents[2]
BASE: dict[str, Any] = {"accelerator_type": "v5p-32", "region": "us-east5", "zones": ["us-east5-a"]}
ALLOWED = "allowed: v5p-32, 2xv5p-16, 4xv5p-8, v5p-16, 2xv5p-8, v5p-8"


def test_shapes_parse_and_a_target_lists_what_may_replace_it() -> None:
    two = parse_shape("2xv5p-16")
    assert (two.name, two.count, two.chips, two.hosts) == ("2xv5p-16", 2, 16, 4)
    assert parse_shape("v5e-16").name == "v5litepod-16"  # the alias, as accelerator_type reads it
    assert ", ".join(smaller_shapes(parse_shape("v5p-32"))) == ALLOWED.removeprefix("allowed: ")
    with pytest.raises(ValueError, match="N in 'NxTYPE' counts slices, 1-64"):
        parse_shape("0xv5p-8")


def test_without_shapes_the_target_alone_and_the_examples_unchanged() -> None:
    assert SliceSpec(**BASE).shapes is None and [s.name for s in SliceSpec(**BASE).shape_list] == ["v5p-32"]
    assert [s.name for s in SliceSpec(**BASE, slices=2).shape_list] == ["2xv5p-32"]
    for name in ("pipeline.yaml", "multislice.yaml"):
        sl = load_spec(ROOT / "examples" / name, PipelineSpec).provision.slice
        assert sl.shapes is None and len(sl.shape_list) == 1
    sl = load_spec(ROOT / "examples" / "elastic.yaml", PipelineSpec).provision.slice
    assert [(s.name, s.chips) for s in sl.shape_list] == [("v5p-32", 16), ("v5p-16", 8), ("v5p-8", 4)]


@pytest.mark.parametrize(
    ("shapes", "message"),
    [
        (
            ["v5p-32", "3xv5p-8"],
            f"shapes[1] '3xv5p-8' is not a shape a v5p-32 run can keep its global batch on "
            f"(same generation, chips dividing 16); {ALLOWED}",
        ),
        (["v5p-32", "v4-16"], "shapes[1] 'v4-16' is not a shape a v5p-32 run can keep its global batch on"),
        (["v5p-32", "v5p-64"], "shapes[1] 'v5p-64' is not a shape"),
        (["v5p-32", "v5p-7"], "shapes[1] 'v5p-7' is not a shape"),
        (["v5p-16", "v5p-8"], "shapes[0] must be the target shape 'v5p-32' (accelerator_type, slices)"),
        (["v5p-32", "v5p-16", "v5p-16"], "has duplicates"),
    ],
)
def test_a_shape_that_cannot_keep_the_global_batch_is_refused(shapes: list[str], message: str) -> None:
    with pytest.raises(ValidationError) as info:
        SliceSpec(**BASE, shapes=shapes)
    (err,) = info.value.errors()
    assert err["loc"] == ("shapes",) and message in str(err["msg"])


def test_validate_refuses_it_in_one_line_naming_the_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = (ROOT / "examples" / "elastic.yaml").read_text()
    bad = tmp_path / "bad.yaml"
    bad.write_text(text.replace("shapes: [v5p-32, v5p-16, v5p-8]", "shapes: [v5p-32, 3xv5p-8]"))
    assert main(["validate", str(bad)]) != 0
    err = capsys.readouterr().err
    line = next(ln for ln in err.splitlines() if "shapes" in ln)
    assert (
        line.strip() == f"provision.slice.shapes: shapes[1] '3xv5p-8' is not a shape a v5p-32 run can keep its "
        f"global batch on (same generation, chips dividing 16); {ALLOWED}"
    )
    assert main(["validate", str(ROOT / "examples" / "elastic.yaml")]) == 0
