"""The capacity summary (tpu_ops/provision/history.py): a ranking reads the history in one GCS request,
and concurrent runs publishing their entries lose none — on fake-gcs-server, requests counted on the
real storage client's HTTP session."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from test_history import IDENT, STATE

from tpu_ops.errors import CloudError
from tpu_ops.provision import history as H
from tpu_ops.provision.choose import History
from tpu_ops.uris import parse_gs

A = ("v5p-32", "us-east5-a", "spot", "compute")
B = ("v5p-32", "us-east5-b", "spot", "compute")


class Counter:
    """Every HTTP request the storage client sends (a response hook on its real session)."""

    def __init__(self, gcs: Any) -> None:
        self.n = 0
        gcs._http.hooks["response"].append(self._hook)

    def _hook(self, response: Any, *args: Any, **kwargs: Any) -> None:
        self.n += 1

    def since(self, start: int) -> int:
        return self.n - start


@pytest.fixture
def gcs(gcs_env: dict[str, str], request: pytest.FixtureRequest) -> Iterator[Any]:
    from tpu_ops.cloud.clients import storage_client
    from tpu_ops.settings import Settings

    client = storage_client(Settings(dry_run=True, gcs_endpoint=gcs_env["TPU_OPS_GCS_ENDPOINT"]))
    name = "sum-" + request.node.name.replace("_", "-")[:40].lower().strip("-")
    client.create_bucket(name)
    yield client.bucket(name)


def _run(bucket: Any, run_id: str, record: dict[str, Any] = STATE) -> None:
    bucket.blob(f"ckpt/{run_id}/_tpu_ops/state.json").upload_from_string(json.dumps(record))
    bucket.blob(f"ckpt/{run_id}/_tpu_ops/capacity.json").upload_from_string(json.dumps(IDENT))


def test_one_read_per_ranking_once_the_summary_exists(gcs: Any) -> None:
    client, root = gcs.client, parse_gs(f"gs://{gcs.name}/ckpt")
    for i in range(12):
        _run(gcs, f"r{i:02d}")
    count = Counter(client)
    first = H.load(client, root, now=20000.0)
    # No summary yet: the full scan (a listing + 2 reads per run), the summary read and its creation.
    assert count.n >= 1 + 2 * 12
    assert first[A] == History(24.0, 12, 12, 3600.0, 12, 720.0, 480)
    assert first == H.fold([(STATE, IDENT)] * 12, now=20000.0)
    start = count.n
    again = H.load(client, root, now=20000.0)
    assert count.since(start) == 1  # the summary alone, whatever the number of runs
    assert again == first

    # A new run publishes its entry: the next ranking sees it, still in one request.
    one_slice = {"incarnations": [{"zone": "us-east5-b", "tier": "spot", "requested_at": 0.0, "ready_at": 60.0,
                                   "ended_at": 60.0 + 7200}]}  # fmt: skip
    assert H.publish(client, root, "new", one_slice, IDENT) == 0
    start = count.n
    after = H.load(client, root, now=20000.0)
    assert count.since(start) == 1
    assert after[B] == first[B].merged(History(hours=2.0, obtained=1, obtain_s_total=60.0))
    assert after[A] == first[A]
    # Publishing again replaces the run's entry (its record grew), never adds it twice.
    H.publish(client, root, "new", {**one_slice, "preemptions": [{"zone": "us-east5-b", "tier": "spot"}]}, IDENT)
    grown = History(hours=2.0, preemptions=1, obtained=1, obtain_s_total=60.0)
    assert H.load(client, root)[B] == first[B].merged(grown)


def test_no_runs_no_summary(gcs: Any) -> None:
    client, root = gcs.client, parse_gs(f"gs://{gcs.name}/ckpt")
    assert H.load(client, root) == {}
    assert H.read_summary(client, root) == (None, 0)  # a ranking over nothing writes nothing


def test_a_stale_generation_is_refused(gcs: Any) -> None:
    client, root = gcs.client, parse_gs(f"gs://{gcs.name}/ckpt")
    H.publish(client, root, "a", STATE, IDENT)
    doc, generation = H.read_summary(client, root)
    assert doc is not None and set(doc["runs"]) == {"a"}
    H.publish(client, root, "b", STATE, IDENT)  # another run wrote in between
    with pytest.raises(CloudError) as exc:
        H.write_summary(client, root, doc, generation)
    assert exc.value.status == 412
    assert set(H.read_summary(client, root)[0]["runs"]) == {"a", "b"}  # type: ignore[index]


def test_concurrent_publishers_lose_no_update(gcs: Any) -> None:
    client, root = gcs.client, parse_gs(f"gs://{gcs.name}/ckpt")
    H.publish(client, root, "seed", STATE, IDENT)  # the summary exists: every writer races on it
    lost: list[int] = []
    errors: list[BaseException] = []

    def one(i: int) -> None:
        try:
            lost.append(H.publish(client, root, f"w{i}", STATE, IDENT))
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors
    doc, _ = H.read_summary(client, root)
    assert doc is not None and set(doc["runs"]) == {"seed", *(f"w{i}" for i in range(6))}
    assert H.combine(doc)[A].preemptions == 7


def test_half_life_weighs_summary_entries_by_when_the_run_was_last_seen() -> None:
    doc = {"version": H.SUMMARY_VERSION, "runs": {"r": H.entry(STATE, IDENT)}}
    assert doc["runs"]["r"]["seen"] == 8720.0 + 3600  # STATE's last slice's end
    aged = H.combine(doc, now=12320.0 + 3600, half_life_s=3600.0)
    assert aged[A] == History(1.0, 0.5, 0.5, 150.0, 0.5, 30.0, 20)
    assert H.combine(doc, now=12320.0 + 3600) == H.fold_run(STATE, IDENT)


def test_milestones_change_with_what_the_summary_holds() -> None:
    m = H.milestones(STATE)
    assert H.milestones(json.loads(json.dumps(STATE))) == m
    ended = json.loads(json.dumps(STATE))
    ended["incarnations"][1]["ended_at"] += 1
    assert H.milestones(ended) != m
    restored = json.loads(json.dumps(STATE))
    restored["preemptions"][0]["restore_s"] = None
    assert H.milestones(restored) != m


def _supervisors_store(gcs: Any, run_id: str) -> Any:
    """The state store a supervised v5p-8 spot run under ``gs://BUCKET/ckpt`` saves through."""
    from tpu_ops.specs.jobs import TrainJobSpec
    from tpu_ops.train.choice import state_store
    from tpu_ops.train.layout import RunLayout

    job = TrainJobSpec.model_validate({
        "provision": {"slice": {"accelerator_type": "v5p-8", "region": "us-east5", "zones": ["us-east5-a"]},
                      "ladder": ["spot"], "budget_usd": 1000, "hours": 2},
        "train": {"checkpoint_dir": f"gs://{gcs.name}/ckpt", "steps": 7200, "checkpoint_every": 300},
    })  # fmt: skip
    return state_store(gcs.client, RunLayout.of(f"gs://{gcs.name}/ckpt", run_id), job, run_id)


def test_the_supervisors_store_publishes_at_milestones_only(gcs: Any) -> None:
    from tpu_ops.train.runstate import IncarnationState, RunState

    client, root = gcs.client, parse_gs(f"gs://{gcs.name}/ckpt")
    store = _supervisors_store(gcs, "sv-1")
    state = RunState("sv-1", 1000.0, 7200)
    count = Counter(client)
    store.save(state)  # no slice yet: an empty entry, the summary created (scan: a listing + 1 run)
    assert set(H.read_summary(client, root)[0]["runs"]) == {"sv-1"}  # type: ignore[index]
    inc = IncarnationState(0, "i0", 1000.0, zone="us-east5-a", tier="spot", ready_at=1060.0)
    state.incarnations.append(inc)
    store.save(state)
    start = count.n
    store.save(state)  # nothing changed but the running hours: state.json only, no summary traffic
    assert count.since(start) == 1
    inc.ended_at, inc.end = 1060.0 + 3600, "done"
    store.save(state)
    ident = ("v5p-8", "us-east5-a", "spot", "compute")
    got = H.load(client, root)
    assert got[ident] == History(hours=1.0, obtained=1, obtain_s_total=60.0)
    assert H.read_summary(client, root)[0]["runs"]["sv-1"]["sums"][0][:4] == list(ident)  # type: ignore[index]


def test_refused_requests_reach_the_summary_with_the_next_slice(gcs: Any) -> None:
    from types import SimpleNamespace

    from tpu_ops.provision.records import Attempt, Outcome
    from tpu_ops.train.choice import noting_stockouts
    from tpu_ops.train.runstate import IncarnationState, RunState

    client, root = gcs.client, parse_gs(f"gs://{gcs.name}/ckpt")
    store = _supervisors_store(gcs, "sv-2")
    supervisor = SimpleNamespace(state=RunState("sv-2", 1000.0, 7200))
    passed: list[Attempt] = []
    note = noting_stockouts(supervisor, passed.append)
    note(Attempt(1, "spot", "us-east5-b", "sv-2-a1", Outcome.STOCKOUT, 30.0))
    note(Attempt(2, "on-demand", "us-east5-b", "sv-2-a2", Outcome.QUOTA, 1.0))  # quota says nothing of capacity
    note(Attempt(3, "spot", "us-east5-a", "sv-2-a3", Outcome.ACTIVE, 60.0))
    assert [a.number for a in passed] == [1, 2, 3]  # the caller's hook still sees every attempt
    assert [(s["zone"], s["tier"]) for s in supervisor.state.stockouts] == [("us-east5-b", "spot")]
    supervisor.state.incarnations.append(IncarnationState(0, "i0", 1000.0, zone="us-east5-a", tier="spot",
                                                          ready_at=1090.0))  # fmt: skip
    store.save(supervisor.state)
    got = H.load(client, root)
    assert got[("v5p-8", "us-east5-b", "spot", "compute")] == History(stockouts=1)
    assert got[("v5p-8", "us-east5-a", "spot", "compute")].obtained == 1
    # The run's state keeps them across a restart of the supervisor.
    assert RunState.from_json(supervisor.state.to_json()).stockouts == supervisor.state.stockouts


def test_a_summary_written_before_stockouts_were_counted_still_reads() -> None:
    old_row = ["v5p-8", "z-a", "spot", "compute", 2.0, 1, 1, 60.0, 1, 30.0, 5]  # 7 sums: no stock-outs
    got = H.combine({"version": H.SUMMARY_VERSION, "runs": {"r": {"seen": 1.0, "sums": [old_row]}}})
    assert got[("v5p-8", "z-a", "spot", "compute")] == History(2.0, 1, 1, 60.0, 1, 30.0, 5, 0)


def test_a_run_s_ask_for_the_reservation_survives_its_next_publish(gcs: Any) -> None:
    """Issue 30: the fleet's asks live in the runs' summary entries (``ask``); a milestone rewrites
    the entry from the run's record, and keeps the ask; a new ask replaces the old."""
    from tpu_ops.provision import fleet

    client, root = gcs.client, parse_gs(f"gs://{gcs.name}/ckpt")
    H.publish(client, root, "a", STATE, IDENT)
    assert H.note_ask(client, root, "a", fleet.ask(0.002, 10.0)) == 0
    H.note_ask(client, root, "b", fleet.ask(0.001, 5.0))  # a run with no entry yet: one with its ask
    H.publish(client, root, "a", {**STATE, "finished_at": 99.0}, IDENT)
    doc = H.read_summary(client, root)[0]
    assert doc is not None and doc["runs"]["a"]["ask"] == {"gain": 0.002, "at": 10.0}
    assert doc["runs"]["a"]["sums"] and doc["runs"]["b"] == {"ask": {"gain": 0.001, "at": 5.0}}
    assert fleet.asks(doc) == (0.001, 0.002)  # oldest first
    H.note_ask(client, root, "a", fleet.ask(0.003, 20.0))
    assert fleet.asks(H.read_summary(client, root)[0]) == (0.001, 0.003)  # type: ignore[arg-type]


def _long_run() -> dict[str, Any]:
    """Ten quiet hours on zone a's spot, seven on zone b's on-demand, then four slices of zone a's spot
    preempted 45 minutes each: one run whose own record shows a change (4 preemptions in 3 h where its
    older 10 h had 1). Every slice asked for 100 s before it was ready."""

    def inc(zone: str, tier: str, ready: float, end: float) -> dict[str, Any]:
        return {"zone": zone, "tier": tier, "requested_at": ready - 100, "ready_at": ready, "ended_at": end}

    spot_a = [(62500.0 + i * 2800, 65200.0 + i * 2800) for i in range(4)]
    return {
        "incarnations": [inc("us-east5-a", "spot", 1000.0, 37000.0), inc("us-east5-b", "on-demand", 37200.0, 62400.0)]
        + [inc("us-east5-a", "spot", r, e) for r, e in spot_a],
        "preemptions": [
            {"zone": "us-east5-a", "tier": "spot", "detected_at": e} for e in (37000.0, *(e for _, e in spot_a))
        ],
        "stockouts": [{"zone": "us-east5-a", "tier": "spot", "at": at} for at in (20000.0, 70850.0)],
    }


def test_an_entry_lists_its_last_six_hours_by_when_each_observation_happened() -> None:
    from tpu_ops.provision import forgetting

    doc = json.loads(json.dumps(H.entry(_long_run(), IDENT)))  # as the summary stores it
    assert doc["seen"] == 73600.0
    # Within 6 h of the last sight (from 52000): zone b's slice at its end, zone a's last four slices with
    # their preemptions (one row each: the same key within 10 minutes), the second refusal with the slice
    # preempted 50 s before it; not the first slice (ended 37000), its preemption, the refusal at 20000.
    assert [row[0] for row in doc["recent"]] == [62400.0, 65200.0, 68000.0, 70850.0, 73600.0]
    assert doc["recent"][3] == [70850.0, *A, 0.75, 1, 1, 100.0, 0, 0.0, 0, 1]
    e = forgetting.entry(doc)
    old, recent = forgetting.split(e, 73600.0)
    assert recent[A] == History(hours=3.0, preemptions=4, obtained=4, obtain_s_total=400.0, stockouts=1)
    assert old[A] == History(hours=10.0, preemptions=1, obtained=1, obtain_s_total=100.0, stockouts=1)
    # Six hours later still, every observation of the run is older than RECENT_S.
    assert forgetting.split(e, 73600.0 + 6 * 3600 + 1)[1] == {}


def test_a_change_inside_one_long_run_resets_the_rung_by_when_it_was_seen() -> None:
    """The run's older 10 h of zone a's spot predict 0-3 preemptions over its last 3 h there; it met 4. Split
    by when each was seen, the rung resets to the recent evidence. Aged as one entry (a summary written before
    entries listed their recent observations), all of it is recent: nothing old to contradict, no reset."""
    from tpu_ops.provision import forgetting

    e = forgetting.entry(json.loads(json.dumps(H.entry(_long_run(), IDENT))))
    got, changes = forgetting.weigh([e], now=80000.0)  # by default, age from the newest evidence (73600)
    assert list(changes) == [A] and changes[A].interval == (0, 3) and changes[A].recent_preemptions == 4
    assert got[A] == History(hours=3.0, preemptions=4, obtained=4, obtain_s_total=400.0, stockouts=1)
    od_b = ("v5p-32", "us-east5-b", "on-demand", "compute")
    assert got[od_b] == History(hours=7.0, obtained=1, obtain_s_total=100.0)  # not reset: kept whole
    whole, none = forgetting.weigh([forgetting.Entry(e.seen, e.sums)], now=80000.0)
    assert none == {} and whole[A] == History(13.0, 5, 5, 500.0, 0, 0.0, 0, 2)


def test_a_run_refused_every_minute_keeps_its_summary_entry_small() -> None:
    """Six hours of refusals, one a minute, on one rung: 36 rows of 10 minutes (and the slice), all 360 counted."""
    record = {
        "incarnations": [{"zone": "us-east5-a", "tier": "spot", "ready_at": 0.0, "ended_at": 21600.0}],
        "stockouts": [{"zone": "us-east5-b", "tier": "spot", "at": 60.0 * i} for i in range(360)],
    }
    rows = H.entry(record, IDENT)["recent"]
    assert len(rows) == 37 and sum(r[-1] for r in rows) == 360
    assert {r[0] for r in rows if r[1:5] == list(B)} == {600.0 * b + 540 for b in range(36)}


def test_a_publish_drops_the_recent_rows_no_reader_can_count_again(gcs: Any) -> None:
    """Rows older than 6 h before the newest run's last sight are old for every reader: the write drops them,
    keeping the (empty) list, so the older run is still split by time: all of it old."""
    from tpu_ops.provision import forgetting

    client, root = gcs.client, parse_gs(f"gs://{gcs.name}/ckpt")

    def rows_after(later_seen: float) -> list[float]:
        inc = {
            "zone": "us-east5-b",
            "tier": "spot",
            "requested_at": 80000.0,
            "ready_at": 80100.0,
            "ended_at": later_seen,
        }
        H.publish(client, root, "later", {"incarnations": [inc]}, IDENT)
        doc, _ = H.read_summary(client, root)
        assert doc is not None
        return [r[0] for r in doc["runs"]["long"]["recent"]]

    H.publish(client, root, "long", _long_run(), IDENT)  # seen 73600, rows from 62400
    assert rows_after(84000.0) == [62400.0, 65200.0, 68000.0, 70850.0, 73600.0]  # from 62400 on: all may count
    assert rows_after(94800.0) == [73600.0]  # before 73200, no reader's now can make them recent again
    assert rows_after(200000.0) == []
    doc, _ = H.read_summary(client, root)
    assert doc is not None
    long = forgetting.entry(doc["runs"]["long"])
    assert long.recent == () and forgetting.split(long, 200000.0)[0][A].hours == 13.0
