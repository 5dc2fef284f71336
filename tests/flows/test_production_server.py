"""The production shape of the Prefect server (docs/production-server.md), for real.

One `prefect server start` on loopback with an auth string (``PREFECT_SERVER_API_AUTH_STRING``) and
its database on a throwaway PostgreSQL cluster (Debian's ``postgresql``, `make tools`): a client
without the auth string, or with a wrong one, is refused (401); `tpu-ops serve` with it serves the
retraining pipeline (flows/dryrun.yaml) against the local stack, and a run created through the API
completes, its record in PostgreSQL.
"""

from __future__ import annotations

import asyncio
import base64
import json
import secrets
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.local._proc import free_port, http_ok, kill_group, wait_until

ROOT = Path(__file__).resolve().parents[2]
PREFECT = str(Path(sys.executable).with_name("prefect"))
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

AUTH = f"operator:{secrets.token_hex(12)}"  # in production: read from a secret store, never from a spec


def call(url: str, body: dict[str, Any] | None = None, auth: str | None = AUTH) -> tuple[int, Any]:
    """(status, JSON body) of a request to the server, with HTTP basic auth from ``auth`` (or none)."""
    headers = {"Content-Type": "application/json"}
    if auth is not None:
        headers["Authorization"] = "Basic " + base64.b64encode(auth.encode()).decode()
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method="POST" if data else "GET", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def _engine_in_group(pgid: int) -> bool:
    """A live ``python -m prefect.engine`` (a flow run's process) in process group ``pgid``."""
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")  # empty for a zombie
            pgrp = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[2])
        except (OSError, IndexError, ValueError):
            continue
        if pgrp == pgid and b"prefect.engine" in argv:
            return True
    return False


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The server (auth string, PostgreSQL, 127.0.0.1) and the environment of a client that has the string."""
    import os

    from infra.local.postgres import PostgresUnavailable, postgres

    home = tmp_path_factory.mktemp("prefect-guarded")
    try:
        pg_cm = postgres()
        pg = pg_cm.__enter__()
    except PostgresUnavailable as exc:
        pytest.skip(f"PostgreSQL server binaries missing ({exc})")
    port = free_port()
    base = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API_")}
    base.update(PREFECT_HOME=str(home), PREFECT_SERVER_ANALYTICS_ENABLED="false")
    server_env = {**base, "PREFECT_SERVER_API_AUTH_STRING": AUTH, "PREFECT_API_DATABASE_CONNECTION_URL": pg.url}
    log = (home / "server.log").open("wb")
    server = subprocess.Popen(
        [PREFECT, "server", "start", "--host", "127.0.0.1", "--port", str(port)],
        env=server_env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    api = f"http://127.0.0.1:{port}/api"
    try:
        t0 = time.monotonic()
        wait_until(lambda: http_ok(f"{api}/health") or server.poll() is not None, 180, 0.2, "prefect server")
        assert server.poll() is None, (home / "server.log").read_text()[-3000:]
        print(f"prefect server on PostgreSQL up in {time.monotonic() - t0:.1f}s")
        client_env = {**base, "PREFECT_API_URL": api, "PREFECT_API_AUTH_STRING": AUTH}
        yield {"api": api, "port": port, "pg": pg, "env": client_env, "log": home / "server.log"}
    finally:
        kill_group(server, grace=10)
        log.close()
        pg_cm.__exit__(None, None, None)


def test_a_client_without_the_auth_string_is_refused(guarded: dict[str, Any]) -> None:
    api = guarded["api"]
    assert call(f"{api}/flows/filter", {}, auth=None)[0] == 401
    assert call(f"{api}/flows/filter", {}, auth="operator:guessed")[0] == 401
    assert call(f"{api}/deployments/filter", {}, auth=None)[0] == 401  # nothing to launch for a stranger
    assert call(f"{api}/flows/filter", {})[0] == 200
    assert call(f"{api}/health", auth=None) == (200, True)  # the health probe stays open (load balancers)

    # Prefect's own client, as `tpu-ops serve` makes it, is refused and told what to set.
    from prefect.settings import PREFECT_API_AUTH_STRING, PREFECT_API_URL, temporary_settings

    from flows.commands.serve import check_auth
    from tpu_ops.errors import ConfigError

    with (
        temporary_settings({PREFECT_API_URL: api}, restore_defaults={PREFECT_API_AUTH_STRING}),
        pytest.raises(ConfigError, match=r"refuses this client \(401\): no auth string") as refused,
    ):
        check_auth()
    assert "PREFECT_API_AUTH_STRING" in refused.value.fix
    with temporary_settings({PREFECT_API_URL: api, PREFECT_API_AUTH_STRING: AUTH}):
        check_auth()

    # It listens on loopback only: the machine's other addresses do not answer.
    others = {a[4][0] for a in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)} - {"127.0.0.1"}
    for addr in sorted(a for a in others if not a.startswith("127.")):
        with socket.socket() as s, pytest.raises(OSError):
            s.settimeout(2)
            s.connect((addr, guarded["port"]))


def test_a_pipeline_run_completes_through_a_served_worker_with_the_auth_string(
    guarded: dict[str, Any], local_stack: Any, tmp_path: Path
) -> None:
    from infra.local.seed import DRY_RUN_CAPACITY, seed_pipeline
    from tpu_ops.specs import PipelineSpec, parse_spec

    local_stack.reset()
    local_stack.set_capacity(DRY_RUN_CAPACITY)
    doc = yaml.safe_load((ROOT / "flows" / "dryrun.yaml").read_text())
    doc.update(name="guarded-dry-run")
    doc.pop("schedule")  # run on request, created through the API below
    seed_pipeline(local_stack.settings(), parse_spec(PipelineSpec, doc))
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(doc))
    env = {**guarded["env"], **local_stack.env(), "TPU_OPS_STATE_DIR": str(tmp_path / "state"),
           "TPU_OPS_POLL_INTERVAL_S": "0.2", "PREFECT_RUNNER_POLL_FREQUENCY": "2", "PYTHONPATH": str(ROOT)}  # fmt: skip
    serve = subprocess.Popen(
        [sys.executable, "-m", "flows.cli", "serve", "--spec", str(tmp_path / "spec.yaml")],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    out: list[bytes] = []
    threading.Thread(target=lambda: out.extend(serve.stdout), daemon=True).start()  # type: ignore[arg-type]
    api = guarded["api"]
    try:
        wait_until(lambda: any(b"serving " in x for x in out) or serve.poll() is not None, 120, 0.2, "tpu-ops serve")
        assert serve.poll() is None, b"".join(out).decode()[-3000:]
        status, dep = call(f"{api}/deployments/name/retraining-pipeline/guarded-dry-run")
        assert status == 200, dep
        assert call(f"{api}/deployments/{dep['id']}/create_flow_run", {}, auth=None)[0] == 401
        status, run = call(f"{api}/deployments/{dep['id']}/create_flow_run", {"tags": ["guarded"]})
        assert status == 201, run
        t0 = time.monotonic()

        def state() -> str:
            s = call(f"{api}/flow_runs/{run['id']}")[1]["state"]
            assert s["type"] not in ("FAILED", "CRASHED", "CANCELLED"), f"{s}\n{b''.join(out).decode()[-4000:]}"
            return str(s["type"])

        wait_until(lambda: state() == "COMPLETED", 600, 1.0, "the pipeline run to complete")
        print(f"pipeline run completed in {time.monotonic() - t0:.1f}s")
        # The run reports COMPLETED before its process exits, and the runner marks a run whose process it still
        # tracks CANCELLED when serve gets SIGTERM (seen under load): stop serve once that process is gone.
        wait_until(lambda: not _engine_in_group(serve.pid), 120, 0.2, "the run's process to exit")
    finally:
        kill_group(serve, grace=20)
        local_stack.reset()

    # The run's record is in PostgreSQL (not a SQLite file under PREFECT_HOME).
    import asyncpg

    async def stored() -> tuple[str, str]:
        conn = await asyncpg.connect(guarded["pg"].url.replace("+asyncpg", ""))
        try:
            row = await conn.fetchrow("SELECT state_type, name FROM flow_run WHERE id = $1", run["id"])
        finally:
            await conn.close()
        return str(row["state_type"]), str(row["name"])

    assert asyncio.run(stored()) == ("COMPLETED", run["name"])
    assert not list(Path(guarded["env"]["PREFECT_HOME"]).glob("*.db"))


def test_make_ui_binds_loopback_and_leaves_the_auth_string_to_the_environment() -> None:
    """`make ui` starts the server on 127.0.0.1 unless told otherwise, and never puts an auth string on its
    command line (where `ps` shows it): Prefect reads PREFECT_SERVER_API_AUTH_STRING from the environment."""
    import os

    env = {**os.environ, "PREFECT_SERVER_API_AUTH_STRING": "operator:s3cret"}
    shown = subprocess.run(["make", "-n", "ui"], cwd=ROOT, env=env, capture_output=True, text=True, check=True).stdout
    start = next(line for line in shown.splitlines() if "prefect server start" in line)
    assert "--host 127.0.0.1 " in start and "s3cret" not in shown
    assert "PREFECT_API_AUTH_STRING" in shown  # it tells the user what clients need
    told = subprocess.run(["make", "-n", "ui", "UI_HOST=10.0.0.5"], cwd=ROOT, capture_output=True, text=True).stdout
    assert "--host 10.0.0.5 " in told


def test_make_ui_on_another_port_serves_a_ui_that_calls_that_port() -> None:
    """`make ui PORT=N`: the UI's pages call the API on N (Prefect derives their API URL from its settings, not
    from --port: without them the browser calls 127.0.0.1:4200, another server or none)."""
    import os
    import shlex

    shown = subprocess.run(["make", "-n", "ui", "PORT=4391"], cwd=ROOT, capture_output=True, text=True, check=True)
    lines = shown.stdout.replace("\\\n", " ").splitlines()
    start = shlex.split(next(line for line in lines if "prefect server start" in line))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_API_", "PREFECT_UI_", "PREFECT_SERVER_"))}
    env.update(word.split("=", 1) for word in start[: start.index(next(w for w in start if "=" not in w))])
    derived = subprocess.run(
        [sys.executable, "-c", "from prefect.settings import get_current_settings as s; print(s().server.ui.api_url)"],
        env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert derived.stdout.strip() == "http://127.0.0.1:4391/api"
