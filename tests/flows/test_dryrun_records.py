"""One dry run, read the way its user reads it: the trail calls a stock-out refused, the log does not
claim "0 resources deleted", and `audit verify`, `audit lineage` and the run page count the same records."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

EXE = Path(sys.executable).with_name("tpu-ops")


@pytest.fixture(scope="module")
def dry_run(default_dry_run: dict[str, Any]) -> dict[str, Any]:
    """The default dry run (shared with tests/flows/test_dryrun.py), its trail read and commands at hand."""
    tmp, summary, out, env = (default_dry_run[k] for k in ("tmp", "summary", "out", "env"))
    env = {k: v for k, v in env.items() if k != "PREFECT_HOME"}  # the dry run's own, asserted unused elsewhere
    trail = Path(summary["files"]["audit_trail"])
    records = [json.loads(line) for line in trail.read_text().splitlines()]

    def tpu_ops(*argv: str) -> str:
        done = subprocess.run([str(EXE), *argv], capture_output=True, text=True, cwd=tmp, env=env, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout

    return {"summary": summary, "log": out.stdout + out.stderr, "records": records, "tpu_ops": tpu_ops, "trail": trail}


@pytest.mark.slow
def test_a_stockout_is_audited_as_refused(dry_run: dict[str, Any]) -> None:
    attempts = [r for r in dry_run["records"] if r["event"] == "slice.provision_attempt"]
    by_outcome = [(r["params"]["outcome"], r["outcome"]) for r in attempts]
    assert ("stockout", "refused") in by_outcome and ("active", "success") in by_outcome, by_outcome
    assert all(audit == ("success" if ladder == "active" else "refused") for ladder, audit in by_outcome), by_outcome
    refused = next(r for r in attempts if r["outcome"] == "refused")
    assert "RESOURCE_POOL_EXHAUSTED" in refused["error"]


@pytest.mark.slow
def test_teardown_claims_no_deletions_it_did_not_make(dry_run: dict[str, Any]) -> None:
    assert "0 resources deleted" not in dry_run["log"]
    assert "teardown: nothing of the run was left to delete" in dry_run["log"]


@pytest.mark.slow
def test_verify_lineage_and_the_run_page_count_the_same_records(dry_run: dict[str, Any]) -> None:
    from flows.report import lineage_markdown

    run_id, trail = dry_run["summary"]["run_id"], str(dry_run["trail"])
    in_chain = sum(r["chain"] == run_id for r in dry_run["records"])
    verify = dry_run["tpu_ops"]("audit", "verify", trail, "--no-signatures")
    lineage = dry_run["tpu_ops"]("audit", "lineage", run_id, "--trail", trail)
    page = lineage_markdown(dry_run["summary"])
    counted = {
        "verify": re.search(r"intact: (\d+) records in 1 chain, and 1 digest", verify),
        "lineage": re.search(rf"audit chain {run_id}: (\d+) records", lineage),
        "run page": re.search(r"OK, signatures checked: (\d+) records in this run's chain", page),
    }
    assert all(counted.values()), (verify, lineage, page)
    assert {k: int(m.group(1)) for k, m in counted.items() if m} == dict.fromkeys(counted, in_chain)
