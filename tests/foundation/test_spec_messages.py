"""How spec errors read: a misspelt field gets "did you mean", a model's own check does not dump the
input back, and Google's other name for a v5e slice is accepted and said."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tpu_ops.errors import SpecError
from tpu_ops.specs import PipelineSpec, ProvisionSpec, parse_spec

ROOT = Path(__file__).resolve().parents[2]
PROVISION = yaml.safe_load((ROOT / "examples" / "provision.yaml").read_text())
PIPELINE = yaml.safe_load((ROOT / "examples" / "pipeline.yaml").read_text())


def _error(model: Any, doc: dict[str, Any]) -> SpecError:
    with pytest.raises(SpecError) as info:
        parse_spec(model, doc)
    return info.value


@pytest.mark.parametrize(
    ("where", "typo", "meant"),
    [
        ((), "budgt_usd", "budget_usd"),
        (("slice",), "acelerator_type", "accelerator_type"),
        (("slice",), "zone", "zones"),
    ],
)
def test_a_misspelt_field_gets_did_you_mean(where: tuple[str, ...], typo: str, meant: str) -> None:
    doc = json.loads(json.dumps(PROVISION))
    node = doc
    for key in where:
        node = node[key]
    node[typo] = node.pop(meant)
    err = _error(ProvisionSpec, doc)
    field = ".".join((*where, typo))
    line = next(line for line in str(err).splitlines() if line.strip().startswith(field + ":"))
    assert f"did you mean {meant!r}?" in line, line


def test_did_you_mean_looks_in_the_model_at_that_place() -> None:
    """A rung's fields inside a pipeline's ladder; a key of a free mapping (labels) gets no guess."""
    doc = json.loads(json.dumps(PIPELINE))
    doc["provision"]["ladder"][0] = {"kind": "reservation", "nam": "fraud-v4-reservation", "zone": "us-central2-b"}
    assert "did you mean 'name'?" in str(_error(PipelineSpec, doc))
    doc = json.loads(json.dumps(PIPELINE))
    doc["train"]["stepz"] = 5
    assert "did you mean 'steps'?" in str(_error(PipelineSpec, doc))
    doc = json.loads(json.dumps(PIPELINE))
    doc["provision"]["xyzzy"] = 1
    assert "did you mean" not in str(_error(PipelineSpec, doc))


def test_a_models_own_check_does_not_dump_the_input() -> None:
    """A check on the whole slice gets the whole mapping as its input: the line names the problem only."""
    doc = json.loads(json.dumps(PROVISION))
    doc["slice"]["zones"] = ["us-west4-a", "us-east1-b"]
    err = _error(ProvisionSpec, doc)
    line = str(err).splitlines()[1]
    assert line == "  slice: zone 'us-east1-b' is not in region 'us-west4'", line
    for bad in ({**PROVISION, "ladder": ["spot", "spot"]}, {**PROVISION, "hours": 0}):
        for line in str(_error(ProvisionSpec, bad)).splitlines()[1:]:
            assert "{" not in line and "..." not in line, line


def test_a_scalar_value_is_shown_once() -> None:
    doc = {**PROVISION, "hours": -2}
    assert "(got -2)" in str(_error(ProvisionSpec, doc))
    doc = json.loads(json.dumps(PROVISION))
    doc["slice"]["accelerator_type"] = "v4-33"
    assert str(_error(ProvisionSpec, doc)).count("'v4-33'") == 1


def test_v5e_names_are_read_as_v5litepod() -> None:
    doc = json.loads(json.dumps(PROVISION))
    doc["slice"]["accelerator_type"] = "v5e-16"
    spec = parse_spec(ProvisionSpec, doc)
    assert spec.slice.accelerator_type == "v5litepod-16"
    assert spec.slice.accelerator.hosts == 2
    doc["slice"]["accelerator_type"] = "v5e-3"
    assert "unknown accelerator type 'v5e-3'" in str(_error(ProvisionSpec, doc))


def test_validate_says_the_alias_was_read(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text((ROOT / "examples" / "provision.yaml").read_text().replace("v5litepod-16", "v5e-16"))
    out = subprocess.run([sys.executable, "-m", "flows.cli", "validate", str(path)], capture_output=True, text=True,
                         cwd=ROOT, check=True)  # fmt: skip
    assert "slice.accelerator_type: 'v5e-16' is read as 'v5litepod-16'" in out.stdout, out.stdout


def test_validate_names_a_directory_with_no_spec_in_it(capsys: pytest.CaptureFixture[str]) -> None:
    """`tpu-ops validate examples/*` (the README's line) reaches examples/orbax_trainer/: it said nothing of it."""
    from flows.cli import main

    assert main(["validate", str(ROOT / "examples" / "orbax_trainer"), str(ROOT / "examples" / "train.yaml")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"{ROOT / 'examples' / 'orbax_trainer'}: a directory with no spec file (.yaml, .yml, .json) " \
        "in it: nothing to check"
    assert lines[1].endswith("train.yaml: ok, a train job spec (tpu-ops train --spec)")
    assert main(["validate", "--json", str(ROOT / "examples" / "orbax_trainer")]) == 0
    assert json.loads(capsys.readouterr().out)["notes"] == ["a directory with no spec file (.yaml, .yml, .json) in it: "
                                                           "nothing to check"]  # fmt: skip
