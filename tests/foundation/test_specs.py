"""Bad input fails with an error naming the field, the value and what is allowed."""

from __future__ import annotations

import copy
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
EXAMPLE = yaml.safe_load((ROOT / "examples" / "pipeline.yaml").read_text())


def with_change(path: str, value: Any) -> dict[str, Any]:
    """The example pipeline with one field (dotted path, [i] for list items) replaced."""
    doc = copy.deepcopy(EXAMPLE)
    keys = [k for k in path.replace("[", ".[").split(".") if k]
    node: Any = doc
    for key in keys[:-1]:
        node = node[int(key[1:-1])] if key.startswith("[") else node[key]
    last = keys[-1]
    if last.startswith("["):
        node[int(last[1:-1])] = value
    elif value is DELETE:
        del node[last]
    else:
        node[last] = value
    return doc


DELETE = object()

# (case id, dotted path to change, bad value, field expected in the error, words expected in it)
BAD: list[tuple[str, str, Any, str, str]] = [
    (
        "unknown accelerator",
        "provision.slice.accelerator_type",
        "v4-33",
        "provision.slice.accelerator_type",
        "allowed: v4-8",
    ),
    (
        "accelerator wrong case",
        "provision.slice.accelerator_type",
        "V4-32",
        "provision.slice.accelerator_type",
        "unknown",
    ),
    ("zone outside region", "provision.slice.zones", ["us-east1-b"], "provision.slice", "not in region"),
    ("malformed zone", "provision.slice.zones", ["central"], "provision.slice.zones[0]", "zone name"),
    ("malformed region", "provision.slice.region", "uscentral", "provision.slice.region", "region name"),
    ("duplicate zones", "provision.slice.zones", ["us-central2-b", "us-central2-b"], "provision.slice", "duplicates"),
    ("no zones", "provision.slice.zones", [], "provision.slice.zones", "at least 1"),
    (
        "reservation in another zone",
        "provision.ladder.[0]",
        {"kind": "reservation", "name": "res", "zone": "us-central2-a"},
        "provision",
        "not one of the slice's zones",
    ),
    (
        "reservation without zone",
        "provision.ladder.[0]",
        {"kind": "reservation", "name": "res"},
        "provision.ladder[0]",
        "needs a zone",
    ),
    (
        "reservation path zone mismatch",
        "provision.ladder.[0]",
        {"kind": "reservation", "name": "projects/acme-ml/zones/us-central2-c/reservations/r", "zone": "us-central2-b"},
        "provision.ladder[0]",
        "is in zone",
    ),
    ("empty ladder", "provision.ladder", [], "provision.ladder", "at least 1"),
    ("duplicate rung", "provision.ladder", ["spot", "spot"], "provision.ladder", "duplicate rung spot"),
    ("unknown rung", "provision.ladder", ["cheap"], "provision.ladder[0]", "'flex-start' or 'calendar'"),
    ("unknown rung kind", "provision.ladder", [{"kind": "preemptible"}], "provision.ladder[0].kind", "'on-demand'"),
    ("bucket uppercase", "mirror.source", "s3://Acme-Data/x", "mirror.source", "invalid S3 bucket name"),
    ("bucket with ..", "mirror.destination", "gs://acme..data/x", "mirror.destination", "no '..'"),
    ("bucket is an IP", "mirror.source", "s3://192.168.1.1/x", "mirror.source", "not an IP address"),
    ("gcs bucket with google", "mirror.destination", "gs://my-google-data/x", "mirror.destination", "google"),
    ("wrong scheme", "mirror.source", "gs://acme-data/x", "mirror.source", "is not a s3://"),
    ("key with ../", "mirror.source", "s3://acme-data/a/../b", "mirror.source", "'..' segment"),
    (
        "control character in prefix",
        "mirror.destination",
        "gs://acme-data/a\nb",
        "mirror.destination",
        "control character",
    ),
    ("schema file escapes", "mirror.schema_file", "../schema.yaml", "mirror.schema_file", "'..' segment"),
    ("shell metacharacters in name", "name", "fraud;rm -rf /", "name", "lowercase letters"),
    ("shell metacharacters in run id", "run_id", "$(reboot)", "run_id", "lowercase letters"),
    ("run id too long", "run_id", "r" * 41, "run_id", "1-40"),
    ("label value with quote", "provision.slice.labels", {"team": "a'b"}, "provision.slice.labels", "label value"),
    ("reserved label", "provision.slice.labels", {"tpu-ops-run": "x"}, "provision.slice.labels", "reserved"),
    ("negative budget", "provision.budget_usd", -5, "provision.budget_usd", "greater than 0"),
    ("huge budget", "provision.budget_usd", 1e12, "provision.budget_usd", "less than or equal to 1000000"),
    ("zero hours", "provision.hours", 0, "provision.hours", "greater than 0"),
    ("queue timeout too long", "provision.queue_timeout", "30d", "provision.queue_timeout", "out of range"),
    ("garbage duration", "provision.queue_timeout", "soon", "provision.queue_timeout", "write 90s, 30m, 2h, 1d"),
    ("concurrency zero", "mirror.concurrency", 0, "mirror.concurrency", "greater than or equal to 1"),
    ("concurrency huge", "mirror.concurrency", 10_000, "mirror.concurrency", "less than or equal to 64"),
    ("bad residency location", "mirror.allowed_locations", ["us central"], "mirror.allowed_locations", "GCS location"),
    ("checkpoint every > steps", "train.checkpoint_every", 10**6, "train.checkpoint_every", "larger than steps"),
    ("negative steps", "train.steps", -1, "train.steps", "greater than or equal to 1"),
    ("trainer with shell", "train.trainer", "os; rm -rf /", "train.trainer", "Python module path"),
    ("bad hyperparameter", "train.hyperparameters", {"Learning Rate": 1}, "train.hyperparameters", "hyperparameter"),
    ("empty command", "train.command", [], "train.command", "non-empty argv"),
    ("command control char", "train.command", ["python3", "a\nb"], "train.command", "control characters"),
    ("bad checkpoint subdir", "train.checkpoint_subdir", "../up", "train.checkpoint_subdir", "checkpoint_subdir"),
    ("poll interval too long", "train.poll_interval", "7h", "train.poll_interval", "out of range"),
    ("bad package group", "export.model_package_group", "fraud model!", "export", "model_package_group"),
    ("bad approval status", "export.approval_status", "Yes", "export.approval_status", "PendingManualApproval"),
    ("bad cron", "schedule", "every monday", "schedule", "cron"),
    ("audit trail on GCS", "audit_bucket", "gs://acme-audit/trail", "audit_bucket", "is not a s3://"),
    ("unknown field", "provision.slice.accelerator", "v4-32", "provision.slice.accelerator", "Extra inputs"),
    ("missing field", "mirror.source", DELETE, "mirror.source", "Field required"),
]


@pytest.mark.parametrize(("case", "path", "value", "field", "words"), BAD, ids=[b[0] for b in BAD])
def test_bad_input_names_its_field(case: str, path: str, value: Any, field: str, words: str) -> None:
    doc = with_change(path, value)
    with pytest.raises(SpecError) as info:
        parse_spec(PipelineSpec, doc)
    fields = [e["field"] for e in info.value.errors]
    assert field in fields, f"{case}: expected an error on {field}, got {info.value}"
    text = str(info.value)
    assert words in text, f"{case}: expected {words!r} in {text}"
    if value is not DELETE and not isinstance(value, list | dict):
        assert repr(value)[:30] in text, f"{case}: the error should show the bad value"


def test_every_field_of_the_pipeline_spec_has_a_bad_input_case() -> None:
    """A field added to the spec without a case here fails this test, not silently passes."""
    covered = {path.split(".")[0] for _case, path, *_ in BAD}
    assert covered == set(PipelineSpec.model_fields), set(PipelineSpec.model_fields) ^ covered


def test_example_pipeline_is_valid_and_round_trips() -> None:
    spec = parse_spec(PipelineSpec, EXAMPLE)
    assert spec.provision.slice.accelerator.hosts == 4
    assert [r.kind for r in spec.provision.ladder] == ["reservation", "spot", "on-demand"]
    again = parse_spec(PipelineSpec, json.loads(spec.model_dump_json()))
    assert again == spec


def test_shorthand_rungs() -> None:
    spec = parse_spec(
        ProvisionSpec,
        {
            "slice": {"accelerator_type": "v5p-128", "region": "us-east5", "zones": ["us-east5-a"]},
            "ladder": ["reservation:big-res@us-east5-a", "spot"],
            "budget_usd": 10,
            "hours": 1,
        },
    )
    assert spec.ladder[0].kind == "reservation"
    assert spec.slice.accelerator.chips == 64


def test_pipeline_schema_renders_for_a_form() -> None:
    schema = PipelineSpec.model_json_schema()
    slice_def = schema["$defs"]["SliceSpec"]
    assert "v5p-128" in slice_def["properties"]["accelerator_type"]["enum"]


@pytest.mark.parametrize(("case", "path", "value", "field", "words"), BAD[:30:3], ids=[b[0] for b in BAD[:30:3]])
def test_validate_command_rejects_bad_files(
    tmp_path: Path, case: str, path: str, value: Any, field: str, words: str
) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(with_change(path, value)))
    out = subprocess.run(
        [sys.executable, "-m", "flows.cli", "validate", "--json", str(bad)], capture_output=True, text=True, cwd=ROOT
    )
    assert out.returncode != 0
    errors = json.loads(out.stdout)["errors"]
    assert field in [e["field"] for e in errors]


def test_json_schema_accepts_what_the_model_sends() -> None:
    """Prefect checks deployment parameters against the JSON schema: the model's dump of a spec with
    shorthand rungs (what serve and launch send) passes it; the shorthand itself is for spec files."""
    import jsonschema

    schema = PipelineSpec.model_json_schema()
    doc = with_change("provision.ladder", ["reservation:fraud-v4-reservation@us-central2-b", "spot", "on-demand"])
    jsonschema.validate(parse_spec(PipelineSpec, doc).model_dump(mode="json"), schema)
    with pytest.raises(jsonschema.ValidationError, match="'on-demand' is not of type 'object'"):
        jsonschema.validate(doc, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(with_change("provision.ladder", [{"kind": "cheap"}]), schema)


def test_json_schema_of_durations_matches_the_validator() -> None:
    import jsonschema

    schema = PipelineSpec.model_json_schema()
    # one string type in the schema (a form field; seconds as "600"); the validator takes a number too
    parse_spec(PipelineSpec, with_change("provision.queue_timeout", 600))
    objects = [{"kind": "reservation", "name": "fraud-v4-reservation", "zone": "us-central2-b"}, {"kind": "spot"}]
    for good in ("30m", "2h", "90s", "600"):
        doc = with_change("provision.queue_timeout", good)
        doc["provision"]["ladder"] = objects  # what a Prefect server is sent (the shorthand is for spec files)
        jsonschema.validate(doc, schema)
        parse_spec(PipelineSpec, doc)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(with_change("provision.queue_timeout", "soon"), schema)
