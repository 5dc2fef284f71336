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
from tpu_ops.specs import PipelineSpec, parse_spec

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


def test_ladder_rungs_are_typed_choices_in_the_form() -> None:
    schema = parameter_schema(all_flows()["retraining-pipeline"].fn).model_dump()
    items = schema["definitions"]["ProvisionSpec"]["properties"]["ladder"]["items"]["anyOf"]
    refs = [i.get("$ref", "").rsplit("/", 1)[-1] for i in items]
    assert refs[:4] == ["ReservationRung", "SpotRung", "OnDemandRung", "FlexStartRung"]  # typed fields each
    assert items[4]["type"] == "string"  # and the shorthand, still accepted by the server's check
    titles = [schema["definitions"][r]["title"] for r in refs[:4]]
    assert titles == ["Reservation", "Spot", "On-demand", "Flex-start"]
    assert "max_run_duration" in schema["definitions"]["FlexStartRung"]["properties"]
    reservation = schema["definitions"]["ReservationRung"]["properties"]
    assert {"name", "zone", "kind"} <= set(reservation)


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
