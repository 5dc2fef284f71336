"""Issue 31, point 7: the spool holds only records of runs that began.

A failure before a run begins (a credential missing, settings, the spec or the budget refused) is
printed, not spooled: the spool would push a record of a run that never existed into the trail of
the next command's environment. A run that began still spools everything while S3 is down.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from tcp_proxy import TcpProxy

from tpu_ops.audit.events import AuditEvent
from tpu_ops.errors import CapacityError, CredentialsError

ROOT = Path(__file__).resolve().parents[2]
EX = ROOT / "examples"


@pytest.fixture
def s3_down(local_stack: Any, env_on_stack: Any) -> Any:
    """Settings whose S3 (trail included) is a proxy that refuses every connection."""
    from tpu_ops.settings import Settings

    with TcpProxy(urlsplit(local_stack.aws_endpoint).port or 0) as proxy:
        proxy.down()
        yield Settings().model_copy(update={"aws_endpoint_url": proxy.url, "retry_attempts": 1})


def _fail(audit: Any, exc: Exception) -> None:
    with pytest.raises(type(exc)), audit.audited(AuditEvent.SLICE_PROVISIONED, params={"zone": "z"}):
        raise exc


def test_a_failure_before_a_run_began_is_printed_not_spooled(s3_down: Any, caplog: Any) -> None:
    from tpu_ops.run import Run

    audit = Run("never-began", s3_down).audit
    with caplog.at_level(logging.WARNING, logger="tpu_ops.audit"):
        _fail(audit, CredentialsError("Google Cloud credentials not found"))
        audit.digest()
    assert audit.trail.spool.pending() == 0 and not audit.trail.spool.path.exists()
    (line,) = [r.getMessage() for r in caplog.records if "never-began" in r.getMessage()]
    assert "slice.provisioned (failure: CredentialsError: Google Cloud credentials not found)" in line
    assert "not recorded and not spooled: the run never began" in line


def test_a_run_that_began_still_spools_when_the_trail_is_unreachable(s3_down: Any) -> None:
    from tpu_ops.run import Run

    began = Run("began", s3_down).audit
    assert began.record(AuditEvent.SLICE_PROVISIONED, params={"zone": "z"}) is None  # S3 down: spooled
    _fail(began, CredentialsError("a token expired mid-run"))  # after it began: kept, whatever the error
    began.digest()
    spool = began.trail.spool
    assert spool.pending() == 3 and spool.holds("began")
    # a failure that may come after something was done (a stock-out after queued requests) is kept too
    other = Run("stocked-out", s3_down).audit
    _fail(other, CapacityError("no capacity in any zone", zone="z", tier="spot"))
    assert spool.pending() == 4 and spool.holds("stocked-out")


def _no_credentials(tmp: Path) -> dict[str, str]:
    tmp.mkdir(parents=True, exist_ok=True)
    keep = ("PATH", "LANG", "LC_ALL", "TMPDIR")
    env = {k: v for k, v in os.environ.items() if k in keep}
    env.update(HOME=str(tmp / "home"), PREFECT_HOME=str(tmp / "prefect"), TPU_OPS_STATE_DIR=str(tmp / "state"),
               TPU_OPS_RETRY_ATTEMPTS="1", NO_GCE_CHECK="true", AWS_EC2_METADATA_DISABLED="true",
               TPU_OPS_DRY_RUN="false", PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="120",
               HTTPS_PROXY="http://127.0.0.1:9", HTTP_PROXY="http://127.0.0.1:9",
               NO_PROXY="127.0.0.1,localhost")  # fmt: skip
    return env


@pytest.mark.slow
def test_commands_without_credentials_leave_the_spool_empty(tmp_path: Path) -> None:
    exe = str(Path(sys.executable).with_name("tpu-ops"))
    lines = [  # the provision flow (a temporary Prefect server) and the export, as a user runs them
        ["provision", "--spec", str(EX / "provision.yaml"), "--run-id", "run-1"],
        ["export", "--spec", str(EX / "pipeline.yaml"), "--run-id", "run-1", "--no-flow"],
    ]
    envs = [_no_credentials(tmp_path / str(n)) for n in range(len(lines))]

    def run(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run([exe, *argv], env=env, capture_output=True, text=True, timeout=240, cwd=ROOT)

    with ThreadPoolExecutor(2) as pool:
        done = list(pool.map(run, lines, envs))
    for argv, env, out in zip(lines, envs, done, strict=True):
        assert out.returncode == 1 and "credentials not found" in out.stderr, (argv, out.stderr[-2000:])
        assert "not recorded and not spooled: the run never began" in out.stderr, (argv, out.stderr[-2000:])
        spool = Path(env["TPU_OPS_STATE_DIR"]) / "audit-spool.jsonl"
        assert not spool.exists() or not spool.read_text().strip(), (argv, spool.read_text())
