"""Every flow is served with a parameter schema the UI can render as a form."""

from __future__ import annotations

from pathlib import Path

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
        "reap-tpu-slices",
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
    assert ladder["items"]["anyOf"][0]["type"] == "string"
    mirror = by_flow["mirror_dataset"]._parameter_openapi_schema.model_dump()
    assert "MirrorSpec" in mirror["definitions"]
    assert by_flow["reap-tpu-slices"].schedules[0].schedule.interval.total_seconds() == 900


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
