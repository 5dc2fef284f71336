"""The startup script quotes every value, is idempotent through the run's DONE marker in GCS,
fetches the agent wheel with the VM's token, passes shellcheck and carries no credentials."""

from __future__ import annotations

import io
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

from tpu_ops.errors import SpecError
from tpu_ops.startup import render_startup_script

NASTY = ["run", "--job", "gs://bkt/p/$(touch pwned)", "--note", "a'b\"c;`id`&&|"]
RUN_URI = "gs://bkt/ckpt/run-1"


def fake_python(tmp_path: Path, real_bootstrap: bool = False) -> Path:
    """A stand-in interpreter: the bootstrap (``-``) runs for real or is skipped, ``-c`` succeeds,
    and the agent's argv is recorded instead of run."""
    exe = tmp_path / "py"
    bootstrap = f'exec {sys.executable} "$@"' if real_bootstrap else "cat >/dev/null; exit 0"
    exe.write_text(
        "#!/bin/bash\n"
        f'if [ "$1" = "-" ]; then {bootstrap}; fi\n'
        'if [ "$1" = "-c" ]; then exit 0; fi\n'
        'printf "%s\\n" "$@" > "$(dirname "$0")/argv.txt"\n'
    )
    exe.chmod(0o755)
    return exe


def render(tmp_path: Path, args: list[str], **kw: Any) -> Path:
    script = tmp_path / "startup.sh"
    kw.setdefault("run_uri", RUN_URI)
    script.write_text(render_startup_script("run-1", args, state_dir=str(tmp_path / "state"), **kw))
    return script


def test_values_arrive_verbatim_and_nothing_is_executed(tmp_path: Path) -> None:
    script = render(tmp_path, NASTY, python=str(fake_python(tmp_path)), agent_prefix=RUN_URI + "/_tpu_ops/agent")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    subprocess.run(["bash", str(script)], check=True, cwd=tmp_path, env=env)
    argv = (tmp_path / "argv.txt").read_text().splitlines()
    assert argv == ["-m", "tpu_ops.agent", *NASTY]
    assert not (tmp_path / "pwned").exists()


@pytest.fixture
def vm(local_stack: Any, tmp_path: Path) -> Any:
    """A GCS bucket on the stack and a fake metadata server, as a worker of a slice sees them."""
    from infra.local.metadata import MetadataServer
    from tpu_ops.cloud.clients import storage_client

    gcs = storage_client(local_stack.settings())
    bucket = gcs.bucket("bkt")
    if not bucket.exists():
        gcs.create_bucket("bkt")
    for blob in gcs.list_blobs("bkt"):
        blob.delete()
    md = MetadataServer({"instance/service-accounts/default/token": '{"access_token": "t", "expires_in": 60}'})
    md.start()
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "GCE_METADATA_HOST": md.host,
           "STORAGE_EMULATOR_HOST": local_stack.gcs_endpoint}  # fmt: skip
    yield gcs, env
    md.stop()


def test_done_marker_in_gcs_makes_a_rerun_a_no_op(tmp_path: Path, vm: Any) -> None:
    gcs, env = vm
    script = render(tmp_path, ["run"], python=str(fake_python(tmp_path, real_bootstrap=True)))
    gcs.bucket("bkt").blob("ckpt/run-1/_tpu_ops/DONE").upload_from_string("{}")
    out = subprocess.run(["bash", str(script)], check=True, capture_output=True, text=True, cwd=tmp_path, env=env)
    assert "already done" in out.stdout
    assert not (tmp_path / "argv.txt").exists()


def test_the_agent_wheel_is_fetched_with_the_vm_token(tmp_path: Path, vm: Any) -> None:
    gcs, env = vm
    agent = RUN_URI + "/_tpu_ops/agent"
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("tpu_ops/agent/__init__.py", "")
    wheel = buf.getvalue()
    gcs.bucket("bkt").blob("ckpt/run-1/_tpu_ops/agent/tpu_ops-0.1.0-py3-none-any.whl").upload_from_string(wheel)
    gcs.bucket("bkt").blob("ckpt/run-1/_tpu_ops/agent/deeper/other.whl").upload_from_string(b"no")
    script = render(tmp_path, ["run"], python=str(fake_python(tmp_path, real_bootstrap=True)), agent_prefix=agent)
    subprocess.run(["bash", str(script)], check=True, capture_output=True, text=True, cwd=tmp_path, env=env)
    wheels = tmp_path / "state" / "run-1" / "wheels"
    assert sorted(p.name for p in wheels.iterdir()) == ["tpu_ops-0.1.0-py3-none-any.whl"]
    assert (wheels / "tpu_ops-0.1.0-py3-none-any.whl").read_bytes() == wheel
    assert (tmp_path / "state" / "run-1" / "agent" / "tpu_ops" / "agent" / "__init__.py").is_file()  # unpacked
    assert (tmp_path / "argv.txt").read_text().splitlines() == ["-m", "tpu_ops.agent", "run"]


@pytest.mark.parametrize(
    ("run_id", "run_uri"), [("Run;reboot", RUN_URI), ("$(id)", RUN_URI), ("ok", "gs://bkt/$(id)/../x"), ("ok", "/x")]
)
def test_unquotable_inputs_are_refused(run_id: str, run_uri: str) -> None:
    with pytest.raises(SpecError):
        render_startup_script(run_id, ["x"], run_uri=run_uri)


def test_rendered_scripts_pass_shellcheck_and_carry_no_credentials(tmp_path: Path) -> None:
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck is not installed (`make tools` installs Debian's package; `make test` runs it)")
    for i, (args, prefix) in enumerate([(NASTY, RUN_URI + "/_tpu_ops/agent"), (["run", "--job", "x"], None)]):
        text = render_startup_script("run-1", args, run_uri=RUN_URI, agent_prefix=prefix)
        path = tmp_path / f"s{i}.sh"
        path.write_text(text)
        out = subprocess.run(["shellcheck", "-s", "bash", str(path)], capture_output=True, text=True)
        assert out.returncode == 0, out.stdout
        lowered = text.lower()
        for word in ("secret", "password", "aws_access_key", "private_key", "begin rsa"):
            assert word not in lowered


def test_a_failed_bootstrap_leaves_one_line_with_the_reason_on_the_console(tmp_path: Path) -> None:
    exe = tmp_path / "py"
    exe.write_text('#!/bin/bash\nif [ "$1" = "-" ]; then cat >/dev/null; exit 5; fi\nexit 0\n')
    exe.chmod(0o755)
    script = render(tmp_path, ["run"], python=str(exe))
    console = tmp_path / "console.log"
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "TPU_OPS_CONSOLE": str(console)}
    out = subprocess.run(["bash", str(script)], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert out.returncode == 5
    (line,) = console.read_text().splitlines()
    assert line.startswith("tpu-ops startup for run run-1 failed (exit 5) while fetching the DONE marker")
    assert line in out.stderr
