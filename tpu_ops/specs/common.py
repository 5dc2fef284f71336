"""Field types shared by every spec: names, URIs, durations, money, labels.

Each type is an annotated ``str``/number so Prefect renders a plain form field, and each
validator's message names the value and what is allowed.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, PlainSerializer, WithJsonSchema

from tpu_ops.layout import MAX_RUN_ID, RUN_ID_PATTERN, run_id_problem
from tpu_ops.text import human_duration, unsafe_char
from tpu_ops.uris import check_key, parse_gs, parse_s3

_NAME = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_LABEL_KEY = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
_LABEL_VALUE = re.compile(r"^[a-z0-9_-]{0,63}$")
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d)?\s*$", re.ASCII)
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, None: 1}


def _describe_for_forms(schema: dict[str, Any]) -> None:
    """What a form shows under each field: its range or format appended to its description, and
    ``<``/``>`` as entities (the Prefect UI renders descriptions as markdown, where ``<run_id>`` is a tag
    and vanishes)."""
    if isinstance(schema.get("description"), str):
        schema["description"] = _escape(schema["description"])
    for prop in (schema.get("properties") or {}).values():
        extra = _range_of(prop)
        text = str(prop.get("description") or "")
        if extra and extra not in text:
            text = f"{text.rstrip()} {extra}".strip()
        if text:
            prop["description"] = _escape(text)


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _range_of(prop: dict[str, Any]) -> str:
    duration = prop.pop("x-duration-range", None) or next(
        (o.pop("x-duration-range") for o in prop.get("anyOf", []) if "x-duration-range" in o), None
    )
    if duration:
        return f"Format: a duration like 90s, 30m, 2h or 1d; from {duration}."
    low = prop.get("minimum", prop.get("exclusiveMinimum"))
    high = prop.get("maximum", prop.get("exclusiveMaximum"))
    if low is None and high is None:
        return ""
    if low is not None and high is not None:
        above = "above " if "exclusiveMinimum" in prop else ""
        return f"Range: {above}{_num(low)} to {_num(high)}."
    return f"At least {_num(low)}." if high is None else f"At most {_num(high)}."


def _num(x: Any) -> str:
    return f"{int(x):,}" if float(x).is_integer() else f"{float(x):,}"


class StrictModel(BaseModel):
    """Base of every spec: unknown fields are errors, not silently dropped."""

    model_config = ConfigDict(
        extra="forbid", frozen=True, str_strip_whitespace=True, json_schema_extra=_describe_for_forms
    )


def _name(max_len: int) -> Any:
    def check(value: str) -> str:
        bad = unsafe_char(value)
        if bad:
            raise ValueError(f"{value!r} is not allowed: it contains {bad}")
        if not _NAME.fullmatch(value) or len(value) > max_len:
            raise ValueError(
                f"{value!r} is not allowed: use 1-{max_len} lowercase letters, digits and '-', "
                "starting with a letter and not ending with '-'"
            )
        return value

    return AfterValidator(check)


Name = Annotated[str, _name(63), Field(json_schema_extra={"pattern": _NAME.pattern})]


def _run_id(value: str) -> str:
    bad = unsafe_char(value)
    problem = f"{value!r} is not allowed: it contains {bad}" if bad else run_id_problem(value)
    if problem:
        raise ValueError(problem)
    return value


# Run ids get suffixes (attempt, rung, zone) inside 63-character resource names: tpu_ops.layout's rule.
RunId = Annotated[
    str, AfterValidator(_run_id), Field(json_schema_extra={"pattern": RUN_ID_PATTERN, "maxLength": MAX_RUN_ID})
]


def _check_s3(value: str) -> str:
    return str(parse_s3(value))


def _check_gs(value: str) -> str:
    return str(parse_gs(value))


S3Uri = Annotated[str, AfterValidator(_check_s3), Field(json_schema_extra={"pattern": r"^s3://"})]
GcsUri = Annotated[str, AfterValidator(_check_gs), Field(json_schema_extra={"pattern": r"^gs://"})]


def _check_relkey(value: str) -> str:
    try:
        return check_key(value)
    except Exception as exc:
        raise ValueError(str(exc)) from None


ObjectKey = Annotated[str, AfterValidator(_check_relkey)]


def parse_duration(value: Any) -> Any:
    """Accept ``90``, ``"90s"``, ``"30m"``, ``"2h"``, ``"1d"`` or ISO 8601; pass timedeltas through."""
    if isinstance(value, timedelta | bool):
        return value
    if isinstance(value, int | float):
        return timedelta(seconds=value)
    if isinstance(value, str):
        m = _DURATION.fullmatch(value)
        if m:
            return timedelta(seconds=float(m.group(1)) * _UNITS[m.group(2)])
    return value  # let pydantic try ISO 8601 and report the error


def _parse_duration_field(value: Any) -> Any:
    """``parse_duration`` for a spec field: a string that is no duration is refused saying what is allowed."""
    parsed = parse_duration(value)
    if isinstance(parsed, str) and not parsed.strip().upper().startswith("P"):
        raise ValueError(f"duration {value!r} is not allowed: write 90s, 30m, 2h, 1d, a number of seconds or ISO 8601")
    return parsed


def bounded_duration(low: timedelta, high: timedelta) -> Any:
    """A validator keeping a duration within ``[low, high]``."""

    def check(value: timedelta) -> timedelta:
        if not low <= value <= high:
            raise ValueError(
                f"duration {human_duration(value.total_seconds())} is out of range: allowed "
                f"{human_duration(low.total_seconds())} to {human_duration(high.total_seconds())}"
            )
        return value

    return AfterValidator(check)


def _seconds(value: timedelta) -> str:
    # Sub-second durations (poll intervals) keep their fraction, so a JSON round trip is exact.
    seconds = value.total_seconds()
    return f"{int(seconds)}s" if seconds == int(seconds) else f"{seconds:g}s"


def Duration(low: timedelta, high: timedelta) -> Any:
    """A ``timedelta`` field written as ``"30m"``/``"2h"``/seconds, bounded to ``[low, high]``."""
    return Annotated[
        timedelta,
        BeforeValidator(_parse_duration_field),
        bounded_duration(low, high),
        PlainSerializer(_seconds, return_type=str, when_used="json"),
        # The schema says what the validator takes, so Prefect's forms and checks agree with it.
        # One string type, so a malformed duration is refused naming the pattern, not "not valid under
        # any of the given schemas"; StrictModel's schema hook writes the range into the description.
        WithJsonSchema(
            {
                "type": "string",
                "pattern": r"^\s*\d+(\.\d+)?\s*[smhd]?\s*$|^P",
                "examples": ["30m", "2h", "3600s"],
                "x-duration-range": f"{human_duration(low.total_seconds())} to {human_duration(high.total_seconds())}",
            }
        ),
    ]


Usd = Annotated[float, Field(gt=0, le=1_000_000, description="US dollars")]


def _check_labels(labels: dict[str, str]) -> dict[str, str]:
    if len(labels) > 48:
        raise ValueError(f"{len(labels)} labels given; at most 48 (tpu-ops adds its own)")
    for key, value in labels.items():
        if not _LABEL_KEY.fullmatch(key):
            raise ValueError(f"label key {key!r} is not allowed: lowercase letter, then [a-z0-9_-], ≤ 63")
        if not _LABEL_VALUE.fullmatch(value):
            raise ValueError(f"label value {value!r} for {key!r} is not allowed: [a-z0-9_-], ≤ 63")
        if key.startswith("tpu-ops"):
            raise ValueError(f"label key {key!r} is reserved: keys starting 'tpu-ops' are set by tpu-ops")
    return labels


Labels = Annotated[dict[str, str], AfterValidator(_check_labels)]
