"""`cost --utilisation` says its commitment figures are for the whole term, not for --hours."""

from __future__ import annotations

import json

import pytest

from flows.cli import main


def test_commitments_name_their_term(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["cost", "--accelerator", "v5p-128", "--hours", "10", "--utilisation", "0.6"]
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    at = next(i for i, line in enumerate(lines) if "commitments" in line)
    assert lines[at] == "  commitments, for their whole term (not the 10 h above), busy 60% of it:"
    one, three = lines[at + 1], lines[at + 2]
    assert one.startswith("    1-year (8,760 h): commitment $") and "over the term" in one, one
    assert three.startswith("    3-year (26,280 h): commitment $") and "over the term" in three, three
    assert main([*argv, "--json"]) == 0
    quotes = json.loads(capsys.readouterr().out)["commitments"]
    assert [(q["years"], q["term_hours"]) for q in quotes] == [(1, 8760.0), (3, 26280.0)]
