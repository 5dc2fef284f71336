"""Help texts and form descriptions agree with the default control plane (Compute Engine) and name
every capacity tier, flex-start included."""

from __future__ import annotations

import pytest

from flows.cli import build_parser
from tpu_ops.specs import PipelineSpec
from tpu_ops.tiers import Tier


def _help(*argv: str, capsys: pytest.CaptureFixture[str]) -> str:
    """The command's own --help and its line in `tpu-ops --help`."""
    with pytest.raises(SystemExit):
        build_parser(argv[0]).parse_args([*argv, "--help"])
    own = " ".join(capsys.readouterr().out.split())
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--help"])
    listing = " ".join(capsys.readouterr().out.split())
    commands = listing[listing.index("positional arguments") :]
    line = commands[commands.index(f" {argv[0]} ") :][:400]
    return own + " | " + line


def test_provision_help_names_every_tier_and_compute_engine_first(capsys: pytest.CaptureFixture[str]) -> None:
    own, line = _help("provision", capsys=capsys).split(" | ", 1)
    for text in (own, line):
        for tier in Tier:
            assert tier.value in text, (tier, text)
    assert own.index("Compute Engine") < own.index("queued resource")


@pytest.mark.parametrize("argv", [("dry-run",), ("local",), ("teardown",), ("reap",)])
def test_the_local_and_cleanup_commands_name_compute_engine(argv: tuple[str, ...], capsys) -> None:  # type: ignore[no-untyped-def]
    text = _help(*argv, capsys=capsys)
    assert "Compute Engine" in text, text
    if "Cloud TPU" in text:
        assert text.index("Compute Engine") < text.index("Cloud TPU"), text


def test_the_form_names_flex_start() -> None:
    defs = PipelineSpec.model_json_schema()["$defs"]
    assert "flex-start" in defs["ProvisionSpec"]["properties"]["ladder"]["description"]
    assert "flex-start" in defs["Rung"]["properties"]["kind"]["description"]
    assert "validUntilDuration" in defs["ProvisionSpec"]["properties"]["queue_timeout"]["description"]
    assert "moves on" in defs["ProvisionSpec"]["properties"]["queue_timeout"]["description"]
