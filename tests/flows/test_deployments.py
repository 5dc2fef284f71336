"""Every flow is served with a parameter schema the UI can render as a form."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema

from flows.deployments import deployments
from tpu_ops.specs import PipelineSpec, load_spec

ROOT = Path(__file__).resolve().parents[2]


def test_deployments_expose_typed_forms_and_the_pipeline_schedule() -> None:
    spec = load_spec(ROOT / "examples" / "pipeline.yaml", PipelineSpec)
    by_flow = {d.flow_name: d for d in deployments(spec)}
    assert set(by_flow) == {
        "retraining-pipeline",
        "mirror_dataset",
        "provision-slice",
        "run-on-slice",
        "train",
        "reap-tpu-slices",
        "seal-audit-trail",
    }
    pipeline = by_flow["retraining-pipeline"]
    assert pipeline.name == "fraud-model"
    assert [s.schedule.cron for s in pipeline.schedules] == ["0 3 * * 1"]
    schema = pipeline._parameter_openapi_schema.model_dump()
    assert schema["required"] == ["spec"]
    # the default parameters Prefect will send satisfy the schema it will check them against
    jsonschema.validate(pipeline.parameters, schema)
    assert "PipelineSpec" in schema["definitions"]
    ladder = schema["definitions"]["ProvisionSpec"]["properties"]["ladder"]
    assert ladder["items"]["$ref"].endswith("/Rung")  # one array of typed rungs: shorthand is sent as objects
    mirror = by_flow["mirror_dataset"]._parameter_openapi_schema.model_dump()
    assert "MirrorSpec" in mirror["definitions"]
    assert by_flow["reap-tpu-slices"].schedules[0].schedule.interval.total_seconds() == 900
    assert by_flow["seal-audit-trail"].schedules[0].schedule.interval.total_seconds() == 3600


def test_serve_without_a_prefect_api_says_so_plainly() -> None:
    import os
    import socket
    import subprocess
    import sys

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PREFECT_API_URL": f"http://127.0.0.1:{port}/api", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-m", "flows.cli", "serve"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 1
    assert f"no Prefect API answers at http://127.0.0.1:{port}/api" in proc.stderr and "make ui" in proc.stderr
    assert "Traceback" not in proc.stderr


@contextlib.contextmanager
def _served(tmp_path: Path, grace_s: int) -> Iterator[tuple[Any, Any, list[bytes]]]:
    """A real ``prefect server start`` and ``tpu-ops serve --shutdown-grace grace_s`` on it, serving:
    ``(server, serve, serve's stdout lines so far)``; both stopped at the end."""
    import os
    import subprocess
    import sys
    import threading

    from infra.local._proc import free_port, http_ok, kill_group, wait_until

    port = free_port()
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "PYTHONPATH": str(ROOT)}  # fmt: skip
    env.pop("PREFECT_API_URL", None)
    prefect = str(Path(sys.executable).with_name("prefect"))
    server = subprocess.Popen(
        [prefect, "server", "start", "--host", "127.0.0.1", "--port", str(port)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    serve = None
    try:
        wait_until(lambda: http_ok(f"http://127.0.0.1:{port}/api/health"), 90, interval=0.2, what="prefect server")
        env["PREFECT_API_URL"] = f"http://127.0.0.1:{port}/api"
        serve = subprocess.Popen(
            [sys.executable, "-m", "flows.cli", "serve", "--shutdown-grace", str(grace_s)],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
        )  # fmt: skip
        out: list[bytes] = []
        reader = threading.Thread(target=lambda: out.extend(serve.stdout), daemon=True)  # type: ignore[union-attr]
        reader.start()
        wait_until(lambda: any(b"serving " in line for line in out) or serve.poll() is not None, 60, what="serving")
        assert serve.poll() is None
        yield server, serve, out
        reader.join(5)
    finally:
        if serve is not None and serve.poll() is None:
            kill_group(serve, grace=1)
        kill_group(server, grace=5)


def test_serve_shuts_down_within_its_grace_when_the_api_is_gone(tmp_path: Path) -> None:
    """Prefect's runner retries pausing its schedules against a vanished API for minutes; the
    deadline armed by SIGTERM ends the process after --shutdown-grace seconds instead."""
    import signal
    import time

    from infra.local._proc import kill_group

    with _served(tmp_path, 3) as (server, serve, _):
        kill_group(server, grace=5)  # the API goes away
        t0 = time.monotonic()
        serve.send_signal(signal.SIGTERM)
        _, err = serve.communicate(timeout=30)
        took = time.monotonic() - t0
        assert serve.returncode == 1, err.decode()[-2000:]
        assert b"shutdown did not finish within 3 s" in err
        assert took < 15


def test_reap_every_sets_the_reapers_interval_and_refuses_what_is_not_allowed(capsys) -> None:
    from datetime import timedelta

    import pytest

    from flows.cli import build_parser

    args = build_parser("serve").parse_args(["serve", "--reap-every", "30m"])
    assert args.reap_every == timedelta(minutes=30)
    reaper = {d.flow_name: d for d in deployments(None, args.reap_every)}["reap-tpu-slices"]
    assert reaper.name == "every-1800s" and reaper.schedules[0].schedule.interval == timedelta(minutes=30)
    with pytest.raises(SystemExit):
        build_parser("serve").parse_args(["serve", "--reap-every", "2s"])
    assert "'2s' is not allowed: a duration from 5s to 1d, e.g. 90s, 30m, 2h" in capsys.readouterr().err


def test_serve_without_an_api_url_refuses_at_once(tmp_path: Path) -> None:
    """No PREFECT_API_URL: Prefect would start a temporary server inside serve, which nobody reaches."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect"), "PYTHONPATH": str(ROOT)}
    env.pop("PREFECT_API_URL", None)
    proc = subprocess.run(
        [sys.executable, "-m", "flows.cli", "serve"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 1
    assert proc.stderr.strip() == (
        "error: serve needs a running Prefect API, and PREFECT_API_URL is not set — fix: start one with "
        "`make ui` and set PREFECT_API_URL=http://127.0.0.1:4200/api"
    ), proc.stderr[-2000:]


def test_serve_ends_cleanly_on_sigterm(tmp_path: Path) -> None:
    """SIGTERM with the API up: the schedules are paused, exit 0, no "coroutine ... never awaited"."""
    import signal

    with _served(tmp_path, 30) as (_, serve, out):
        serve.send_signal(signal.SIGTERM)
        rest, err = serve.communicate(timeout=60)
        text = err.decode()
        assert serve.returncode == 0, text[-2000:]
        assert "never awaited" not in text and "Traceback" not in text and "did not finish" not in text, text[-2000:]
    assert b"SIGTERM: stopping" in b"".join(out) + (rest or b"")
