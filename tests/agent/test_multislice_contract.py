"""The multislice job contract: every worker's variables come from the live allocation document."""

from __future__ import annotations

from pathlib import Path

import pytest

from tpu_ops.agent.job import (
    MEGASCALE_PORT,
    ContractError,
    Job,
    RunPaths,
    allocation_doc,
    contract_env,
    job_env,
    placement,
)
from tpu_ops.agent.metadata import WorkerIdentity

JOB = Job("r", "gs://b/r", 10, 5, coordinator_port=9000)


def _host(slice_eps: list[str], worker: int) -> WorkerIdentity:
    return WorkerIdentity(worker, len(slice_eps), f"node-{slice_eps[0]}", "us-east5-a", tuple(slice_eps))


def _envs(doc: dict[str, object]) -> list[dict[str, str]]:
    """Every worker of every slice of ``doc``, in slice then host order, as the agent computes it."""
    out = []
    for s in doc["slices"]:  # type: ignore[attr-defined]
        for w in range(len(s["endpoints"])):
            where = placement(_host(s["endpoints"], w), s["index"], doc)
            out.append(contract_env(JOB, _host(s["endpoints"], w), None, Path("p"), "inc", where))
    return out


def test_one_slice_is_the_contract_as_before() -> None:
    who = _host(["h-0", "h-1"], 1)
    env = contract_env(JOB, who, 3, Path("p"))
    assert env["TPU_OPS_WORKER"] == env["TPU_OPS_PROCESS_ID"] == env["JAX_PROCESS_ID"] == "1"
    assert env["TPU_OPS_WORKERS"] == env["TPU_OPS_PROCESSES"] == env["JAX_NUM_PROCESSES"] == "2"
    assert (env["TPU_OPS_SLICE"], env["TPU_OPS_SLICES"]) == ("0", "1")
    assert env["TPU_OPS_COORDINATOR_ADDRESS"] == env["JAX_COORDINATOR_ADDRESS"] == "h-0:9000"
    assert not [k for k in env if k.startswith("MEGASCALE_")]  # single slice: JAX's multislice runtime stays off
    read = job_env({**env, "TPU_OPS_CHECKPOINT_DIR": "gs://b/r"})
    assert (read.slice, read.slices, read.process_id, read.processes) == (0, 1, 1, 2)
    # a trainer written before multislice (no TPU_OPS_PROCESS_ID) reads its worker as its process
    old = {k: v for k, v in env.items() if k not in ("TPU_OPS_PROCESS_ID", "TPU_OPS_PROCESSES")}
    assert (job_env(old).process_id, job_env(old).processes) == (1, 2)


def test_two_slices_of_two_hosts_are_one_job_of_four_processes() -> None:
    doc = allocation_doc("inc", [("qr-a", ["10.0.0.1", "10.0.0.2"]), ("qr-b", ["10.0.1.1", "10.0.1.2"])])
    envs = _envs(doc)
    assert [e["TPU_OPS_PROCESS_ID"] for e in envs] == ["0", "1", "2", "3"]  # global id = slice * hosts + worker
    assert [e["JAX_PROCESS_ID"] for e in envs] == ["0", "1", "2", "3"]
    assert [e["TPU_OPS_WORKER"] for e in envs] == ["0", "1", "0", "1"]  # the host within its slice
    assert [e["MEGASCALE_SLICE_ID"] for e in envs] == [e["TPU_OPS_SLICE"] for e in envs] == ["0", "0", "1", "1"]
    for e in envs:
        assert e["TPU_OPS_PROCESSES"] == e["JAX_NUM_PROCESSES"] == "4"
        assert e["MEGASCALE_NUM_SLICES"] == e["TPU_OPS_SLICES"] == "2"
        assert e["MEGASCALE_COORDINATOR_ADDRESS"] == f"10.0.0.1:{MEGASCALE_PORT}"  # slice 0, worker 0
        assert e["MEGASCALE_PORT"] == str(MEGASCALE_PORT)
        assert e["JAX_COORDINATOR_ADDRESS"] == e["TPU_OPS_COORDINATOR_ADDRESS"] == "10.0.0.1:9000"
        read = job_env({**e, "TPU_OPS_CHECKPOINT_DIR": "gs://b/r"})
        assert (read.slices, read.processes) == (2, 4)


def test_after_a_replacement_every_worker_names_the_live_slices_only() -> None:
    """A public report: a job hung after a slice preemption because its environment still said 3 slices
    for 2. Every variable is computed from the allocation the workers start on, never remembered."""
    before = allocation_doc("0-a", [("qr-a", ["10.0.0.1"]), ("qr-b", ["10.0.1.1"]), ("qr-c", ["10.0.2.1"])])
    assert {e["MEGASCALE_NUM_SLICES"] for e in _envs(before)} == {"3"}
    # slice 0 (the coordinator's) is lost and replaced by qr-d; then a smaller allocation of two
    replaced = allocation_doc("1-b", [("qr-d", ["10.0.3.1"]), ("qr-b", ["10.0.1.1"]), ("qr-c", ["10.0.2.1"])])
    shrunk = allocation_doc("2-c", [("qr-b", ["10.0.1.1"]), ("qr-c", ["10.0.2.1"])])
    for doc, live in ((replaced, {"10.0.3.1", "10.0.1.1", "10.0.2.1"}), (shrunk, {"10.0.1.1", "10.0.2.1"})):
        envs = _envs(doc)
        n = str(len(doc["slices"]))  # type: ignore[arg-type]
        first = doc["slices"][0]["endpoints"][0]  # type: ignore[index]
        for e in envs:
            assert e["MEGASCALE_NUM_SLICES"] == e["TPU_OPS_SLICES"] == n
            assert e["MEGASCALE_COORDINATOR_ADDRESS"] == f"{first}:{MEGASCALE_PORT}"
            assert e["JAX_NUM_PROCESSES"] == n
            assert "10.0.0.1" not in "".join(e.values())  # the lost slice's host is named nowhere
        assert sorted(int(e["JAX_PROCESS_ID"]) for e in envs) == list(range(len(live)))


def test_a_placement_outside_the_allocation_is_refused() -> None:
    doc = allocation_doc("inc", [("qr-a", ["h"])])
    with pytest.raises(ContractError, match="slice 1"):
        placement(_host(["h"], 0), 1, doc)


def test_state_paths_name_slice_and_host() -> None:
    paths = RunPaths("gs://b/r", "", "gs://b/r/_tpu_ops")
    assert paths.heartbeat(1) == "r/_tpu_ops/heartbeats/worker-1.json"  # slice 0: as with one slice
    assert paths.heartbeat(1, 2) == "r/_tpu_ops/heartbeats/slice-2-worker-1.json"
    assert paths.worker_report(0, 1) == "r/_tpu_ops/workers/slice-1-worker-0.json"
    assert paths.notice(0, 1) == "r/_tpu_ops/notices/slice-1-worker-0.json"
    assert paths.allocation == "r/_tpu_ops/allocation.json"
