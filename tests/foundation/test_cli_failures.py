"""Every ``tpu-ops`` command, run with no credentials and with endpoints that do not answer, says
what is missing and the fix on one line and exits non-zero; no traceback unless ``--debug``.

The table names every command of ``flows.cli.COMMANDS`` (a test checks it does), with the command
line to run and, for the few that touch no cloud, why they have no row.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from flows.cli import COMMANDS

ROOT = Path(__file__).resolve().parents[2]
ARN = "arn:aws:sagemaker:us-east-1:123456789012:model-package/fraud-model/1"
EX = ROOT / "examples"

# command -> command lines (each must fail on one line). Flows run with --no-flow (the same library
# calls, without starting a temporary Prefect server: ~15 s each).
TABLE: dict[str, list[list[str]]] = {
    "approve": [["approve", ARN, "--approver", "me", "--no-flow"]],
    "audit": [["audit", "verify"], ["audit", "lineage", "run-1"], ["audit", "dump"]],
    "capacity": [
        ["capacity", "stats", "--history", "gs://acme-ckpt/runs"],
        ["capacity", "plan", "--spec", str(EX / "provision.yaml"), "--history", "gs://acme-ckpt/runs"],
    ],
    "cost": [["cost", "--run", "run-never-started"]],
    "deploy": [["deploy", ARN, "--endpoint", "fraud", "--no-flow"]],
    "doctor": [["doctor"]],
    "export": [["export", "--spec", str(EX / "pipeline.yaml"), "--run-id", "run-1", "--no-flow"]],
    "launch": [["launch", str(EX / "train.yaml"), "--run-id", "run-1", "--detach"]],
    "local": [["local", "seed"]],
    "mirror": [["mirror", "s3://acme-src/data", "gs://acme-dst/data", "--no-progress"]],
    "provision": [["provision", "--spec", str(EX / "provision.yaml"), "--run-id", "run-1", "--no-flow"]],
    "reap": [["reap", "--no-prefect"], ["reap"]],
    "serve": [["serve", "--spec", str(ROOT / "flows" / "dryrun.yaml")]],
    "teardown": [["teardown", "run-1"]],
    "train": [["train", "--spec", str(EX / "train.yaml"), "--run-id", "run-1", "--no-flow"]],
}
NO_CLOUD = {
    "dry-run": "starts its own emulated clouds (tests/flows/test_dryrun.py)",
    "validate": "reads files only (test_validate_*)",
    # these find the run in the local state directory first, and refuse an unknown one before any call
    # (tests/flows/test_operate_args.py); on a launched run, tests/flows/test_operate.py
    "status": "reads the local launch records first",
    "logs": "reads the local launch records first",
    "cancel": "reads the local launch records first",
}
# `audit flush` sends only what a failed run spooled (nothing here); `local up` starts its own clouds.
# What each row's line must name, when it is not the scenario's usual reason.
PREFECT_FIRST = {"serve", "launch"}  # needs the Prefect API (when one is configured) before any cloud
LOCAL_ONLY = {"local seed"}  # refuses a non-local environment before any call


def test_the_table_covers_every_command() -> None:
    assert set(TABLE) | set(NO_CLOUD) == set(COMMANDS)


@pytest.fixture(scope="module")
def refused() -> Iterator[dict[str, str]]:
    """Loopback ports that refuse connections for the whole module: bound, never listening."""
    socks = []
    ports = {}
    for name in ("aws", "gcs", "tpu", "sts", "compute", "logging", "prefect", "proxy"):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports[name] = f"http://127.0.0.1:{s.getsockname()[1]}"
    yield ports
    for s in socks:
        s.close()


def _base_env(tmp: Path, refused: dict[str, str]) -> dict[str, str]:
    keep = ("PATH", "LANG", "LC_ALL", "SYSTEMROOT", "TMPDIR")
    env = {k: v for k, v in os.environ.items() if k in keep}
    env.update(
        HOME=str(tmp / "home"),  # no gcloud or AWS config files
        PREFECT_HOME=str(tmp / "prefect"),
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        PREFECT_API_URL=refused["prefect"] + "/api",
        TPU_OPS_STATE_DIR=str(tmp / "state"),
        TPU_OPS_RETRY_ATTEMPTS="1",
        NO_GCE_CHECK="true",  # no probe of the metadata server for credentials
        AWS_EC2_METADATA_DISABLED="true",
        # Anything that still tried to leave loopback would meet a proxy that refuses it.
        HTTPS_PROXY=refused["proxy"],
        HTTP_PROXY=refused["proxy"],
        NO_PROXY="127.0.0.1,localhost",
    )
    return env


def _scenarios(tmp: Path, refused: dict[str, str]) -> dict[str, dict[str, str]]:
    none = {**_base_env(tmp, refused), "TPU_OPS_DRY_RUN": "false"}
    down = {
        **_base_env(tmp, refused),
        "TPU_OPS_DRY_RUN": "true",
        "AWS_ENDPOINT_URL": refused["aws"],
        "STORAGE_EMULATOR_HOST": refused["gcs"],
        "TPU_OPS_TPU_ENDPOINT": refused["tpu"],
        "TPU_OPS_STS_ENDPOINT": refused["sts"],
        "TPU_OPS_COMPUTE_ENDPOINT": refused["compute"],
        "TPU_OPS_LOGGING_ENDPOINT": refused["logging"],
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
    }
    return {"no credentials": none, "endpoints down": down}


def _run(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    exe = str(Path(sys.executable).with_name("tpu-ops"))
    return subprocess.run([exe, *argv], env=env, capture_output=True, text=True, timeout=180, cwd=ROOT)


def _expect(scenario: str, argv: list[str], refused: dict[str, str]) -> tuple[str, ...]:
    """Any of these must appear in the line."""
    line = " ".join(argv[:2])
    if argv[0] == "cost":
        return ("no ledger found",)
    if scenario == "endpoints down":
        return tuple(v for k, v in refused.items() if k != "proxy")
    if argv[0] in PREFECT_FIRST:
        return (refused["prefect"],)
    if line in LOCAL_ONLY:
        return ("local stack",)
    return ("credentials not found",)


def test_every_command_fails_on_one_line(tmp_path: Path, refused: dict[str, str]) -> None:
    jobs = [
        (scenario, argv, env)
        for scenario, env in _scenarios(tmp_path, refused).items()
        for lines in TABLE.values()
        for argv in lines
    ]
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda j: _run(j[1], j[2]), jobs))
    problems = []
    for (scenario, argv, _), res in zip(jobs, results, strict=True):
        what = f"[{scenario}] tpu-ops {' '.join(argv)} (exit {res.returncode})"
        out = res.stdout + res.stderr
        if res.returncode == 0:
            problems.append(f"{what}: exit 0\n{out}")
            continue
        if "Traceback" in out:
            problems.append(f"{what}: traceback\n{out[-1500:]}")
            continue
        if argv[0] == "doctor":  # its report is one MISSING line (and its fix) per problem
            if "MISSING" not in res.stdout:
                problems.append(f"{what}: no MISSING line\n{out}")
            continue
        lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
        errors = [ln for ln in lines if ln.startswith("error:")]
        want = _expect(scenario, argv, refused)
        if len(errors) != 1 or not any(w in errors[0] for w in want) or "fix:" not in errors[0]:
            problems.append(f"{what}: wanted one 'error: ... {want[0]} ... fix: ...' line\n{res.stderr[-1500:]}")
    assert not problems, "\n\n".join(problems)


def test_debug_shows_the_traceback(tmp_path: Path, refused: dict[str, str]) -> None:
    env = _scenarios(tmp_path, refused)["no credentials"]
    quiet = _run(["teardown", "run-1"], env)
    loud = _run(["teardown", "run-1", "--debug"], env)
    by_env = _run(["teardown", "run-1"], {**env, "TPU_OPS_DEBUG": "1"})
    assert quiet.returncode == loud.returncode == by_env.returncode == 1
    assert "Traceback" not in quiet.stderr
    assert "Traceback" in loud.stderr and "DefaultCredentialsError" in loud.stderr
    assert "Traceback" in by_env.stderr
    assert loud.stderr.rstrip().splitlines()[-1] == quiet.stderr.rstrip().splitlines()[-1]
