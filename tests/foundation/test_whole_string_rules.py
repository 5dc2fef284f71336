"""Every regex rule over user input takes the whole string: ``^...$`` with ``re.match`` let a final
``\\n`` through (``$`` matches before it), and ``\\d``/``\\s`` take Unicode digits and spaces."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tpu_ops.export.registry import check_package_arn
from tpu_ops.specs import common, jobs
from tpu_ops.specs import slice as slice_spec
from tpu_ops.uris import check_gcs_bucket, check_s3_bucket

ARN = "arn:aws:sagemaker:us-east-1:123456789012:model-package/fraud-model/1"
RULES: list[tuple[str, Callable[[Any], Any], Any, Any]] = [
    ("zone", slice_spec._check_zone, "us-central2-b", "us-central2-b\n"),
    ("region", slice_spec._check_region, "us-central2", "us-central2\n"),
    ("label", common._check_labels, {"team": "ml"}, {"team": "ml\n"}),
    ("label key", common._check_labels, {"team": "ml"}, {"team\n": "ml"}),
    ("trainer", jobs._check_trainer, "pkg.mod:main", "pkg.mod:main\n"),
    ("subdir", jobs._check_subdir, "items", "items\n"),
    ("hyperparameter", jobs._check_hyperparameters, {"lr": 1}, {"lr\n": 1}),
    ("s3 bucket", check_s3_bucket, "acme-src", "acme-src\n"),
    ("gcs bucket", check_gcs_bucket, "acme-dst", "acme-dst\n"),
    ("model package arn", check_package_arn, ARN, ARN + "\n"),
    ("model package arn, digits", check_package_arn, ARN, ARN.replace("123456789012", "\u0661" * 12)),
]


@pytest.mark.parametrize(("what", "check", "good", "bad"), RULES, ids=[r[0] for r in RULES])
def test_a_rule_refuses_a_final_newline_and_unicode_digits(what: str, check: Callable[[Any], Any], good: Any,
                                                           bad: Any) -> None:  # fmt: skip
    check(good)
    with pytest.raises(Exception) as caught:
        check(bad)
    assert isinstance(caught.value, ValueError), caught.value


@pytest.mark.parametrize("text", ["\u0661h", "\uff130m", "1\u2003h"])  # surrounding ASCII whitespace is fine
def test_durations_are_ascii_and_whole(text: str) -> None:
    assert common.parse_duration(text) == text  # not parsed: left for pydantic to refuse
    assert common.parse_duration("90") != "90"


def test_a_schedule_is_a_whole_cron_line() -> None:
    with pytest.raises(ValueError, match="cron"):
        jobs.PipelineSpec._cron("0 3 * * 1\n")
