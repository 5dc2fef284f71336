"""Flows, hooks, the CLI and the reaper, with real processes: kill -9 and cancellation from Prefect."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from tpu_ops.errors import ProvisioningError
from tpu_ops.provision import teardown

ZA, ZB = "us-central2-a", "us-central2-b"
ROOT = Path(__file__).resolve().parents[2]

SPEC = {
    "slice": {"accelerator_type": "v4-32", "region": "us-central2", "zones": [ZA, ZB]},
    "ladder": [{"kind": "spot"}],  # the object form: Prefect's parameter schema lacks the "spot" shorthand
    "budget_usd": 10_000,
    "hours": 2,
    "queue_timeout": "60s",
    "overall_timeout": "120s",
}


@pytest.fixture
def env(local_stack: Any, tpu_url: str, tmp_path: Path, prefect_api: None) -> dict[str, str]:
    """Environment for child processes: the stack, the fake TPU API, the test Prefect API."""
    import prefect.settings

    base = {k: v for k, v in os.environ.items() if not k.startswith(("TPU_OPS_", "PREFECT_"))}
    return {
        **base,
        **local_stack.env(),
        "TPU_OPS_TPU_ENDPOINT": tpu_url,
        "TPU_OPS_STATE_DIR": str(tmp_path / "state"),
        "TPU_OPS_POLL_INTERVAL_S": "0.05",
        "TPU_OPS_RETRY_INITIAL_DELAY_S": "0.01",
        "TPU_OPS_RETRY_MAX_DELAY_S": "0.1",
        "PREFECT_API_URL": str(prefect.settings.PREFECT_API_URL.value()),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_RUNNER_POLL_FREQUENCY": "1",
        "NO_GCE_CHECK": "true",
        "PYTHONPATH": str(ROOT),
    }


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[str]]]:
    """Processes a test starts; each is killed (by its own pid) if still running at the end."""
    started: list[subprocess.Popen[str]] = []
    yield started
    for p in started:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=10)


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "flows.cli", *args], env=env, capture_output=True, text=True,
                          timeout=120, cwd=ROOT)  # fmt: skip


def _run_resources(fake: Any, run_id: str) -> dict[str, str]:
    st = fake.state()
    items = {**st["queued_resource_states"], **st["node_states"]}
    return {k: v for k, v in items.items() if k.rsplit("/", 1)[-1].startswith(run_id + "-a")}


def test_kill_9_while_provisioning_then_reap_leaves_nothing(
    fake: Any, env: dict[str, str], tmp_path: Path, procs: list[Any], waiter: Any
) -> None:
    fake.capacity({ZA: {"spot": 0}, ZB: {"spot": 0}})  # the request waits in the queue
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(SPEC))
    cmd = [sys.executable, "-m", "flows.cli", "provision", "--spec", str(spec), "--run-id", "run-kill"]
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    procs.append(proc)
    waiter(lambda: _run_resources(fake, "run-kill"), timeout=60, what="the flow to create its queued resource")
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait(timeout=10) == -signal.SIGKILL
    fake.capacity({ZA: {"spot": 4096}})  # capacity frees up: the orphan request now gets a slice
    waiter(lambda: "READY" in _run_resources(fake, "run-kill").values(), timeout=10, what="the orphan to be granted")

    dry = _cli("reap", "--dry-run", "--json", env=env)
    assert dry.returncode == 0, dry.stderr
    report = json.loads(dry.stdout)
    assert [r["run_id"] for r in report["reaped"]] == ["run-kill"] and report["dry_run"]
    assert _run_resources(fake, "run-kill")  # a dry run deletes nothing

    out = _cli("reap", env=env)
    assert out.returncode == 0, out.stderr
    assert "deleted run run-kill" in out.stdout and "the process that provisioned it is gone" in out.stdout
    assert fake.state()["queued_resources"] == 0 and fake.state()["nodes"] == 0


@pytest.mark.parametrize(
    ("flow_name", "params", "until"),
    [
        # run-on-slice holds its slice: its own `finally` tears down too
        ("run-on-slice", {"hold_seconds": 600}, "READY"),
        # provision-slice is cancelled while its request waits in the queue: nothing but the
        # on_cancellation hook deletes it
        ("provision-slice", {}, "WAITING_FOR_RESOURCES"),
    ],
)
def test_cancelling_a_flow_run_from_prefect_deletes_the_slice(
    fake: Any, env: dict[str, str], procs: list[Any], waiter: Any, tmp_path: Path, flow_name: str,
    params: dict[str, Any], until: str,
) -> None:  # fmt: skip
    if until != "READY":
        fake.capacity({ZA: {"spot": 0}, ZB: {"spot": 0}})
    func = flow_name.replace("-", "_")
    server = subprocess.Popen(
        [sys.executable, "-c", f"from flows.provision import {func}; {func}.serve(name='cancel-test')"],
        env=env, cwd=ROOT, stdout=(tmp_path / "serve.log").open("w"), stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    procs.append(server)
    try:
        _cancel_and_check(fake, waiter, flow_name, params, until)
    except BaseException:
        print((tmp_path / "serve.log").read_text()[-6000:])
        raise
    server.send_signal(signal.SIGTERM)
    server.wait(timeout=30)


def _cancel_and_check(fake: Any, waiter: Any, flow_name: str, params: dict[str, Any], until: str) -> None:
    from prefect.client.orchestration import get_client
    from prefect.states import Cancelling

    with get_client(sync_client=True) as client:

        def deployment() -> Any:
            try:
                return client.read_deployment_by_name(f"{flow_name}/cancel-test")
            except Exception:
                return None

        dep = waiter(deployment, timeout=60, what="the served deployment", interval=0.2)
        fr = client.create_flow_run_from_deployment(dep.id, parameters={"spec": SPEC, "run_id": "run-cancel", **params})
        waiter(lambda: until in _run_resources(fake, "run-cancel").values(), timeout=60, what=f"a resource {until}")
        client.set_flow_run_state(fr.id, Cancelling(), force=True)
        waiter(lambda: not _run_resources(fake, "run-cancel"), timeout=60, what="the slice to be deleted")
        state = waiter(lambda: (s := client.read_flow_run(fr.id).state) and s.is_final() and s, timeout=60,
                       what="the flow run to be final", interval=0.2)  # fmt: skip
        assert state.is_cancelled(), state
        tags = client.read_flow_run(fr.id).tags
        assert "tpu-ops-run:run-cancel" in tags


@pytest.fixture
def inproc(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Flows run in this process read the same TPU_OPS_* environment the child processes get."""
    for key, value in env.items():
        if key.startswith("TPU_OPS_") or key == "PREFECT_API_URL":
            monkeypatch.setenv(key, value)


def test_failed_flow_hook_tears_down(fake: Any, inproc: None) -> None:
    from flows.provision import provision_slice

    fake.capacity({ZA: {"spot": 0}, ZB: {"spot": 0}})
    with pytest.raises(ProvisioningError):
        provision_slice({**SPEC, "queue_timeout": "1s"}, "run-hook")
    assert not _run_resources(fake, "run-hook")


def test_provision_flow_failing_after_its_slice_is_up_tears_it_down(
    fake: Any, inproc: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing else cleans up a slice provision-slice made before failing: only its on_failure hook."""
    import flows.provision

    def artifacts_down(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("the Prefect artifacts API is down")

    monkeypatch.setattr(flows.provision, "create_table_artifact", artifacts_down)
    with pytest.raises(RuntimeError, match="artifacts API"):
        flows.provision.provision_slice(SPEC, "run-fail-late")
    assert not _run_resources(fake, "run-fail-late")


def test_run_on_slice_tears_down_when_the_command_fails(fake: Any, inproc: None) -> None:
    from flows.provision import run_on_slice

    with pytest.raises(subprocess.CalledProcessError):
        run_on_slice(SPEC, "run-cmd", command=[sys.executable, "-c", "import sys; sys.exit(3)"])
    assert fake.state()["nodes"] == 0


def test_cli_provision_teardown_and_cost(fake: Any, env: dict[str, str], tmp_path: Path) -> None:
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(SPEC))
    out = _cli("provision", "--spec", str(spec), "--run-id", "run-cli", "--json", env=env)  # the Prefect flow
    assert out.returncode == 0, out.stderr
    s = json.loads(out.stdout)
    assert (s["tier"], s["hosts"], s["queued_resource"]) == ("spot", 4, "run-cli-a1")
    again = _cli("provision", "--spec", str(spec), "--run-id", "run-cli", "--json", "--no-flow", env=env)
    assert json.loads(again.stdout)["node"] == s["node"]
    down = _cli("teardown", "run-cli", "--json", env=env)
    assert down.returncode == 0 and json.loads(down.stdout)["confirmed_gone"]
    cost = _cli("cost", "--run", "run-cli", "--json", env=env)
    assert json.loads(cost.stdout)["open_slices"] == 0 and "spot" in json.loads(cost.stdout)["usd_by_tier"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["provision", "--spec", "{spec}", "--run-id", "Bad_Id"], "run id"),
        (["provision", "--spec", "/nonexistent.yaml", "--run-id", "ok"], "nonexistent"),
        (["reap", "--ttl", "soon"], "--ttl"),
        (["cost", "--chips", "3"], "--generation"),
        (["cost", "--accelerator", "v9-8"], "unknown accelerator"),
    ],
)
def test_cli_bad_input_fails_before_any_cloud_call(
    fake: Any, env: dict[str, str], tmp_path: Path, args: list[str], message: str
) -> None:
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(SPEC))
    fake.faults({"path": ".", "status": 500, "count": 1})  # consumed by any call that reaches the API
    out = _cli(*[a.format(spec=spec) for a in args], env=env)
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert message in out.stderr
    assert fake.state()["faults_pending"] == 1


def test_cli_refuses_over_budget(fake: Any, env: dict[str, str], tmp_path: Path) -> None:
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({**SPEC, "budget_usd": 1}))
    out = _cli("provision", "--spec", str(spec), "--run-id", "run-broke", env=env)
    assert out.returncode == 1 and "over budget" in out.stderr and "$1.00" in out.stderr
    assert "fix: raise budget_usd" in out.stderr
    assert "BudgetError" not in out.stderr  # the message, not the class name
    assert fake.state()["operations"] == 0


def test_cost_cli_agrees_with_the_issue_arithmetic(env: dict[str, str], fake: Any) -> None:
    out = _cli("cost", "--chips", "128", "--price", "8", "--json", env=env)
    assert json.loads(out.stdout)["tiers"]["given"]["usd_per_hour"] == 1024.0
    txt = _cli("cost", "--accelerator", "v5p-128", "--price", "8", "--tokens-per-second", "100000", env=env).stdout
    assert "64 chips" in txt and "$512.00/h" in txt


def test_help_for_every_command(env: dict[str, str], fake: Any) -> None:
    for cmd in ("provision", "teardown", "reap", "cost"):
        out = _cli(cmd, "--help", env=env)
        assert out.returncode == 0 and "usage: tpu-ops " + cmd in out.stdout


def test_teardown_of_unknown_run_is_a_no_op(fake: Any, settings: Any) -> None:
    assert teardown("never-ran", settings).deleted == []


def test_sigterm_crash_runs_the_crashed_hook_and_tears_down(
    fake: Any, env: dict[str, str], tmp_path: Path, procs: list[Any], waiter: Any
) -> None:
    fake.capacity({ZA: {"spot": 0}, ZB: {"spot": 0}})
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(SPEC))
    log = tmp_path / "flow.log"
    cmd = [sys.executable, "-m", "flows.cli", "provision", "--spec", str(spec), "--run-id", "run-term"]
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=log.open("w"), stderr=subprocess.STDOUT, text=True)
    procs.append(proc)
    waiter(lambda: _run_resources(fake, "run-term"), timeout=60, what="the flow to create its queued resource")
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    text = log.read_text()
    assert "Running hook 'teardown_hook' in response to entering state 'Crashed'" in text, text[-3000:]
    assert not _run_resources(fake, "run-term")


def test_quota_limit_is_held_in_chips_while_the_slice_exists(fake: Any, inproc: None, tmp_path: Path) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate

    from flows.provision import run_on_slice

    with get_client(sync_client=True) as client:
        client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name="tpu-chips", limit=32))
    try:
        seen = tmp_path / "slots.txt"
        probe = (
            "from prefect.client.orchestration import get_client\n"
            "with get_client(sync_client=True) as c:\n"
            "    limit = c.read_global_concurrency_limit_by_name('tpu-chips')\n"
            f"    open({str(seen)!r}, 'w').write(str(limit.active_slots))\n"
        )
        run_on_slice({**SPEC, "quota_limit": "tpu-chips"}, "run-quota", command=[sys.executable, "-c", probe])
        assert seen.read_text() == "16"  # v4-32 holds 16 chips of the limit while it runs
        with get_client(sync_client=True) as client:
            assert client.read_global_concurrency_limit_by_name("tpu-chips").active_slots == 0
    finally:
        with get_client(sync_client=True) as client:
            client.delete_global_concurrency_limit_by_name("tpu-chips")


def test_a_missing_quota_limit_is_a_clear_error_before_provisioning(fake: Any, inproc: None) -> None:
    from flows.provision import run_on_slice
    from tpu_ops.errors import SpecError

    with pytest.raises(SpecError, match="no-such-limit"):
        run_on_slice({**SPEC, "quota_limit": "no-such-limit"}, "run-noquota")
    assert fake.state()["operations"] == 0


@pytest.mark.parametrize("hooks", ["on_failure_hooks", "on_cancellation_hooks", "on_crashed_hooks"])
def test_every_provisioning_flow_carries_the_teardown_hook(hooks: str) -> None:
    from flows.pipeline import retraining_pipeline
    from flows.provision import provision_slice, run_on_slice, teardown_hook
    from flows.train import train

    for f in (retraining_pipeline, provision_slice, run_on_slice, train):
        assert getattr(f, hooks) == [teardown_hook], f"{f.name}: {hooks}"


def test_the_teardown_hook_finds_the_run_by_its_tag(fake: Any, inproc: None, settings: Any) -> None:
    """A flow run whose parameters do not name the run (the pipeline derives its run id): the hook
    reads the run's tag back from the Prefect API and tears that run down."""
    from prefect import flow
    from prefect.client.orchestration import get_client

    from flows.provision import run_tag, teardown_hook
    from tpu_ops.provision import provision
    from tpu_ops.specs.slice import ProvisionSpec

    provision(ProvisionSpec.model_validate(SPEC), "run-tagged", settings)
    provision(ProvisionSpec.model_validate(SPEC), "run-other", settings)

    @flow(name="tagged-elsewhere")
    def noop() -> None:
        pass

    with get_client(sync_client=True) as client:
        fr = client.create_flow_run(noop, parameters={}, tags=["unrelated"])
        client.update_flow_run(fr.id, tags=["unrelated", run_tag("run-tagged")])
        stale = client.read_flow_run(fr.id).model_copy(update={"tags": ["unrelated"]})
    try:
        teardown_hook(flow=noop, flow_run=stale, state="Failed")
        assert not _run_resources(fake, "run-tagged")
        assert _run_resources(fake, "run-other"), "only the tagged run is torn down"
    finally:
        teardown("run-other", settings)


def test_the_teardown_hook_adds_what_it_deleted_to_the_copy_of_a_training_runs_ledger(
    fake: Any, inproc: None, local_stack: Any, tmp_path: Path
) -> None:
    """A supervisor that died with its slice up published the slice open; the flow's hook tears it down and
    adds its GONE to the copy, so that a shell elsewhere sees the run's cost stop (``train.costs``)."""
    from prefect import flow
    from prefect.client.orchestration import get_client

    from flows.provision import run_tag, teardown_hook
    from tpu_ops.cloud.clients import storage_client
    from tpu_ops.layout import RunLayout
    from tpu_ops.provision import provision
    from tpu_ops.provision.ledger import GONE, Ledger
    from tpu_ops.provision.prices import load
    from tpu_ops.settings import Settings
    from tpu_ops.specs.slice import ProvisionSpec
    from tpu_ops.train import costs

    settings, run_id = Settings(), "run-trained"  # the worker's (TPU_OPS_* of this process), as the hook's
    gcs = storage_client(settings)
    bucket = gcs.create_bucket(f"hook-ckpt-{os.getpid()}")
    layout = RunLayout.of(f"gs://{bucket.name}/runs", run_id)
    elsewhere = local_stack.settings(state_dir=tmp_path / "elsewhere")

    @flow(name="train-died")
    def noop() -> None:
        pass

    try:
        provision(ProvisionSpec.model_validate(SPEC), run_id, settings)
        costs.Publisher(gcs, layout, Ledger(settings, run_id)).publish()  # the supervisor's last copy
        assert costs.known(elsewhere, run_id, load(elsewhere), gcs, layout).cost.open_slices == 1
        spec = {"provision": SPEC, "train": {"checkpoint_dir": f"gs://{bucket.name}/runs"}}
        with get_client(sync_client=True) as client:
            fr = client.create_flow_run(noop, parameters={}, tags=[run_tag(run_id)])
            crashed = client.read_flow_run(fr.id).model_copy(update={"parameters": {"spec": spec}})
        teardown_hook(flow=noop, flow_run=crashed, state="Crashed")
        assert not _run_resources(fake, run_id)
        assert costs.read(gcs, layout)["events"][-1]["kind"] == GONE  # type: ignore[index]
        seen, here = costs.known(elsewhere, run_id, load(elsewhere), gcs, layout).cost, Ledger(settings, run_id)
        assert seen.open_slices == 0 and seen.usd_total == here.summary(load(settings)).usd_total > 0
    finally:
        teardown(run_id, settings)
        for blob in gcs.list_blobs(bucket.name):
            blob.delete()
        bucket.delete()


GATHER = """
import json, sys
from tpu_ops.provision.lease import SliceLease
from tpu_ops.settings import Settings
from tpu_ops.specs.slice import ProvisionSpec
SliceLease(ProvisionSpec.model_validate(json.loads(sys.argv[1])), sys.argv[2], Settings()).gather()
"""


def test_kill_9_while_gathering_an_allocation_then_reap_leaves_nothing_of_either_slice(
    fake: Any, env: dict[str, str], procs: list[Any], waiter: Any
) -> None:
    # On the TPU API the 2 slices are one multislice queued resource: granted, its two nodes still booting.
    fake.capacity({ZA: {"spot": 32}, ZB: {"spot": 0}})
    fake.latency(provision_s=600)
    spec = {**SPEC, "slice": {**SPEC["slice"], "slices": 2}}  # type: ignore[dict-item]
    cmd = [sys.executable, "-c", GATHER, json.dumps(spec), "run-gather"]
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    procs.append(proc)

    def gathering() -> bool:
        states = _run_resources(fake, "run-gather")
        return {k.rsplit("/", 1)[-1]: v for k, v in states.items()} == {
            "run-gather-a1": "PROVISIONING", "run-gather-a1-0": "CREATING", "run-gather-a1-1": "CREATING"}  # fmt: skip

    waiter(gathering, timeout=60, what="the request granted, both slices' nodes booting")
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait(timeout=10) == -signal.SIGKILL
    out = _cli("reap", env=env)
    assert out.returncode == 0, out.stderr
    assert "deleted run run-gather" in out.stdout
    assert _run_resources(fake, "run-gather") == {}  # neither slice's node nor the request is left
    assert fake.state()["queued_resources"] == 0 and fake.state()["nodes"] == 0


def test_kill_9_while_gathering_on_compute_engine_then_reap_leaves_nothing_of_either_slice(
    env: dict[str, str], compute_url: str, procs: list[Any], waiter: Any, fakes: Any
) -> None:
    """The same on Compute Engine, where each slice is its own group with its own workload policy."""
    fake = partial(fakes.call, compute_url)
    fake("POST", "/_fake/reset")
    fake("POST", "/_fake/capacity", {"us-east5-a": {"SPOT": 16}, "us-east5-b": {"SPOT": 0}})  # room for one v5p-32
    spec = {**SPEC, "slice": {"accelerator_type": "v5p-32", "region": "us-east5", "zones": ["us-east5-a"],
                              "backend": "compute", "slices": 2}}  # fmt: skip
    cmd = [sys.executable, "-c", GATHER, json.dumps(spec), "run-gather-ce"]
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    procs.append(proc)

    def left() -> int:
        st = fake("GET", "/_fake/state")
        kinds = ("instances", "instance_templates", "resource_policies", "instance_group_managers")
        return sum(int(st[k]) for k in kinds)

    # slice 0's group (4 instances) is up and slice 1's group exists, waiting for hosts
    waiter(lambda: fake("GET", "/_fake/state")["instance_group_managers"] >= 2, timeout=90, what="two groups")
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait(timeout=10) == -signal.SIGKILL
    assert left() > 0
    out = _cli("reap", env=env)
    assert out.returncode == 0, out.stderr
    assert "deleted run run-gather-ce" in out.stdout
    assert left() == 0, fake("GET", "/_fake/state")  # groups, templates, workload policies, instances: all gone
