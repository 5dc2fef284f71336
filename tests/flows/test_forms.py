"""The UI's run forms explain themselves: every parameter of every flow says what it is, rungs are
typed choices, and bad values are refused naming the field and what is allowed."""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from prefect import Flow
from prefect.utilities.callables import parameter_schema

from tpu_ops.errors import SpecError
from tpu_ops.specs import PipelineSpec, Tier, parse_spec

ROOT = Path(__file__).resolve().parents[2]


def all_flows() -> dict[str, Flow[Any, Any]]:
    found = {}
    for m in pkgutil.iter_modules([str(ROOT / "flows")]):  # the package, not tests/flows
        module = importlib.import_module(f"flows.{m.name}")
        for obj in vars(module).values():
            if isinstance(obj, Flow) and obj.__module__ == module.__name__:
                found[obj.name] = obj
    return found


def undescribed(schema: dict[str, Any]) -> list[str]:
    """Properties without a description (a property that only references a described model counts)."""
    out = []
    definitions = schema.get("definitions", {})
    for where, block in [("(parameters)", schema), *definitions.items()]:
        for name, prop in block.get("properties", {}).items():
            ref = (prop.get("$ref") or (prop.get("allOf") or [{}])[0].get("$ref") or "").rsplit("/", 1)[-1]
            if not prop.get("description") and not (ref and definitions[ref].get("description")):
                out.append(f"{where}.{name}")
    return out


def test_every_parameter_of_every_flow_has_a_description() -> None:
    found = all_flows()
    assert {"retraining-pipeline", "reap-tpu-slices", "mirror_dataset", "provision-slice", "run-on-slice"} <= set(found)
    missing = {name: undescribed(parameter_schema(f.fn).model_dump()) for name, f in found.items()}
    assert {k: v for k, v in missing.items() if v} == {}


def test_ladder_rungs_are_one_typed_model_with_a_kind_choice() -> None:
    schema = parameter_schema(all_flows()["retraining-pipeline"].fn).model_dump()
    ladder = schema["definitions"]["ProvisionSpec"]["properties"]["ladder"]
    # one array of typed rungs: no list-level choice (the form's toggle between choices emptied the ladder)
    assert "anyOf" not in ladder and ladder["type"] == "array"
    assert ladder["items"]["$ref"].rsplit("/", 1)[-1] == "Rung"
    assert '{"kind": "reservation", "name": "NAME", "zone": "ZONE"}' in ladder["description"]
    rung = schema["definitions"]["Rung"]
    assert list(rung["properties"]) == ["kind", "name", "zone", "max_run_duration"] and not rung.get("required")
    kind_ref = rung["properties"]["kind"]["$ref"].rsplit("/", 1)[-1]
    assert schema["definitions"][kind_ref]["enum"] == [t.value for t in Tier]  # a choice, every tier in it
    # the form shows every field whatever the kind: each title names the tiers that use it
    titles = {k: v["title"] for k, v in rung["properties"].items() if k != "kind"}
    assert titles == {
        "name": "Reservation name (reservation, calendar rungs)",
        "zone": "Reservation zone (reservation, calendar rungs)",
        "max_run_duration": "Max run duration (flex-start, calendar rungs)",
    }


def test_field_titles_name_exactly_the_tiers_that_use_them() -> None:
    """The titles follow TIER_FIELDS: a tier added to a field's row must be named in its title."""
    from tpu_ops.specs.slice import RUNG_FIELDS, TIER_FIELDS, Rung

    for field in RUNG_FIELDS:
        title = Rung.model_fields[field].title or ""
        tiers = [str(t.value) for t in Tier if field in TIER_FIELDS.get(t, frozenset())]
        assert title.endswith(f"({', '.join(tiers)} rungs)"), (field, title)


def test_the_shorthand_is_accepted_in_spec_files_and_sent_as_objects() -> None:
    """Spec files keep `spot` and `reservation:NAME@ZONE`; what we send a Prefect server is the object form."""
    from tpu_ops.specs import ProvisionSpec

    doc = yaml.safe_load((ROOT / "examples" / "provision.yaml").read_text())
    doc["ladder"] = ["reservation:res-a@" + doc["slice"]["zones"][0], "spot"]
    sent = parse_spec(ProvisionSpec, doc).model_dump(mode="json")["ladder"]
    assert [{k: v for k, v in r.items() if v is not None} for r in sent] == [
        {"kind": "reservation", "name": "res-a", "zone": doc["slice"]["zones"][0]},
        {"kind": "spot"},
    ]


def test_a_new_tier_is_one_enum_value_and_optional_fields() -> None:
    """Each tier's fields come from one table: a tier with no row is a plain choice that takes no field."""
    from tpu_ops.specs.slice import TIER_FIELDS, Rung

    assert Rung.model_validate({"kind": "spot"}).short_name == ""
    with pytest.raises(ValueError, match="name is not used by a spot rung"):
        Rung.model_validate({"kind": "spot", "name": "res"})
    with pytest.raises(ValueError, match="a reservation rung needs its name"):
        Rung.model_validate({"kind": "reservation", "zone": "us-central2-b"})
    assert set(TIER_FIELDS) <= set(Tier)


@pytest.mark.parametrize(
    ("change", "field", "words"),
    [
        (
            {"train": {"steps": 1000, "checkpoint_every": 5000}},
            "train.checkpoint_every",
            "than steps (1000); allowed: 1 to 1000",
        ),
        ({"provision": {"queue_timeout": "ten minutes"}}, "provision.queue_timeout", "write 90s, 30m, 2h, 1d"),
        ({"schedule": "every monday"}, "schedule", "5-field cron expression like '0 3 * * 1'"),
    ],
)
def test_cross_field_and_format_errors_name_the_field_and_what_is_allowed(
    change: dict[str, Any], field: str, words: str
) -> None:
    doc = yaml.safe_load((ROOT / "flows" / "dryrun.yaml").read_text())
    for key, value in change.items():
        if isinstance(value, dict):
            doc[key].update(value)
        else:
            doc[key] = value
    with pytest.raises(SpecError) as err:
        parse_spec(PipelineSpec, doc)
    assert [e["field"] for e in err.value.errors] == [field]
    assert words in err.value.errors[0]["message"]


def test_run_id_appears_once_in_the_pipeline_form() -> None:
    schema = parameter_schema(all_flows()["retraining-pipeline"].fn).model_dump()
    assert "run_id" not in schema["properties"]  # not a second, top-level one
    assert "run_id" in schema["definitions"]["PipelineSpec"]["properties"]


def test_descriptions_show_ranges_formats_and_angle_brackets() -> None:
    """The form renders descriptions as markdown: `<run_id>` would vanish as a tag, so it is escaped."""
    import jsonschema

    defs = parameter_schema(all_flows()["retraining-pipeline"].fn).model_dump()["definitions"]
    assert defs["MirrorSpec"]["properties"]["concurrency"]["description"].endswith("Range: 1 to 64.")
    timeout = defs["ProvisionSpec"]["properties"]["queue_timeout"]
    assert "Format: a duration like 90s, 30m, 2h or 1d; from 1s to 7d." in timeout["description"]
    with pytest.raises(jsonschema.ValidationError) as bad:  # one schema: the error names the format
        jsonschema.validate("ten minutes", timeout)
    assert "does not match" in bad.value.message
    subdir = defs["TrainSpec"]["properties"]["checkpoint_subdir"]["description"]
    assert "below &lt;checkpoint_dir&gt;/&lt;run_id&gt;" in subdir and "<" not in subdir
    schedule = defs["PipelineSpec"]["properties"]["schedule"]["description"]
    assert schedule.startswith("Used only by `tpu-ops serve`")


def test_a_cross_field_rule_fails_the_run_on_one_line(prefect_api: None) -> None:
    """checkpoint_every > steps cannot be said in JSON schema: the run fails before any step, in one line."""
    from flows.pipeline import retraining_pipeline

    doc = yaml.safe_load((ROOT / "flows" / "dryrun.yaml").read_text())
    doc["train"].update(steps=100, checkpoint_every=500)
    state = retraining_pipeline(spec=doc, return_state=True)  # as the UI sends it: JSON, not a model
    assert state.is_failed()
    assert state.message is not None and "\n" not in state.message
    assert state.message.startswith("invalid spec: spec.train.checkpoint_every:"), state.message
