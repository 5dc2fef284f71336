"""The verdict table: one row per thing that can happen to an allocation (train.verdict.decide)."""

from __future__ import annotations

from typing import Any

import pytest

from tpu_ops.provision.providers.base import Phase
from tpu_ops.train.verdict import Facts, Kind, SliceFacts, Verdict, decide

UP = SliceFacts(0, Phase.RUNNING, "ACTIVE", ("RUNNING", "RUNNING"))
UP1 = SliceFacts(1, Phase.RUNNING, "RUNNING", ("RUNNING", "RUNNING"))


def note(worker: int, slice_index: int = 0) -> dict[str, Any]:
    return {"worker": worker, "slice": slice_index, "incarnation": "i", "time": 1.0, "grace_s": 5}


def report(worker: int, rc: int, terminated: bool = False, slice_index: int = 0) -> dict[str, Any]:
    return {"worker": worker, "slice": slice_index, "exit_code": rc, "terminated": terminated, "log_tail": "boom"}


ROWS: list[tuple[str, Facts, Verdict]] = [
    ("healthy: every slice up, steps moving", Facts((UP,), hosts=2), Verdict(Kind.HEALTHY)),
    ("healthy: a slice still booting is not lost", Facts((SliceFacts(0, Phase.BOOTING, "PROVISIONING"),)),
     Verdict(Kind.HEALTHY)),
    ("healthy: between polls, no notice", Facts(), Verdict(Kind.HEALTHY)),
    ("finished: the DONE marker", Facts((UP,), done={"time": 5.0}),
     Verdict(Kind.FINISHED, "DONE", detail={"time": 5.0})),
    ("finished beats a lost slice (the run ended before the slice went)",
     Facts((SliceFacts(0, Phase.LOST, "PREEMPTED"),), done={}), Verdict(Kind.FINISHED, "DONE")),
    ("preempted: a SIGTERM notice, before the API says so", Facts((UP,), notices=(note(1),)),
     Verdict(Kind.PREEMPTED, "preemption notice (SIGTERM) from worker 1", 0, (1,))),
    ("preempted: a notice between polls (no API state read)", Facts(notices=(note(0), note(1))),
     Verdict(Kind.PREEMPTED, "preemption notice (SIGTERM) from worker 0, 1", 0, (0, 1))),
    ("preempted: the control plane lost the slice", Facts((SliceFacts(0, Phase.LOST, "PREEMPTED"),)),
     Verdict(Kind.PREEMPTED, "PREEMPTED", 0, notice_due=True)),
    ("preempted: the queued resource was suspended", Facts((SliceFacts(0, Phase.LOST, "queued resource SUSPENDED"),)),
     Verdict(Kind.PREEMPTED, "queued resource SUSPENDED", 0, notice_due=True)),
    ("preempted: the slice is being deleted", Facts((SliceFacts(0, Phase.DELETING, "DELETING"),)),
     Verdict(Kind.PREEMPTED, "DELETING", 0, notice_due=True)),
    ("preempted: the control plane no longer knows the slice", Facts((SliceFacts(0, None, "slice missing"),)),
     Verdict(Kind.PREEMPTED, "slice missing", 0)),
    ("preempted: one slice of two, the other healthy", Facts((UP, SliceFacts(1, Phase.LOST, "PREEMPTED"))),
     Verdict(Kind.PREEMPTED, "PREEMPTED", 1, notice_due=True)),
    ("preempted: notices from one slice of two name it", Facts((UP, UP1), notices=(note(0, 1), note(1, 1))),
     Verdict(Kind.PREEMPTED, "preemption notice (SIGTERM) from worker 0 of slice 1, 1 of slice 1", 1, (0, 1))),
    ("host lost: the API shows one host's VM terminated in a running slice",
     Facts((UP, SliceFacts(1, Phase.RUNNING, "RUNNING", ("RUNNING", "TERMINATED")))),
     Verdict(Kind.HOST_LOST, "host 1 TERMINATED", 1, (1,), notice_due=True)),
    ("host lost: a worker terminated without a notice", Facts((UP,), reports=(report(1, 143, terminated=True),)),
     Verdict(Kind.HOST_LOST, "workers terminated", 0, (1,))),
    ("failed: a trainer exited non-zero on a healthy slice",
     Facts((UP,), reports=(report(1, 1), report(0, 0))),
     Verdict(Kind.FAILED, "exit 1", 0, (1,), report(1, 1))),
    ("failed: the lowest (slice, worker) is named",
     Facts((UP, UP1), reports=(report(1, 2, slice_index=1), report(0, 3, slice_index=1))),
     Verdict(Kind.FAILED, "exit 3", 1, (0,), report(0, 3, slice_index=1))),
    ("stalled: no progress past the limit, workers still running",
     Facts((UP,), hosts=2, since_progress_s=31.0, stall_limit_s=30.0),
     Verdict(Kind.STALLED, "stalled: no new step for 30s")),
    ("not stalled: within the limit", Facts((UP,), hosts=2, since_progress_s=29.0, stall_limit_s=30.0),
     Verdict(Kind.HEALTHY)),
    ("not stalled: every worker has reported (waiting on DONE)",
     Facts((UP,), reports=(report(0, 0), report(1, 0)), hosts=2, since_progress_s=99.0, stall_limit_s=30.0),
     Verdict(Kind.HEALTHY)),
    ("a notice beats a failed exit (SIGTERM made the trainer exit)",
     Facts((UP,), notices=(note(0),), reports=(report(0, 143),)),
     Verdict(Kind.PREEMPTED, "preemption notice (SIGTERM) from worker 0", 0, (0,))),
    ("a lost slice beats a stall", Facts((SliceFacts(0, Phase.LOST, "STOPPED"),), since_progress_s=99.0,
                                         stall_limit_s=1.0), Verdict(Kind.PREEMPTED, "STOPPED", 0, notice_due=True)),
]  # fmt: skip


@pytest.mark.parametrize(("case", "facts", "expected"), ROWS, ids=[r[0] for r in ROWS])
def test_verdict(case: str, facts: Facts, expected: Verdict) -> None:
    assert decide(facts) == expected


def test_every_verdict_has_a_row() -> None:
    kinds = {v.kind for _, _, v in ROWS}
    assert kinds == {Kind.HEALTHY, Kind.STALLED, Kind.PREEMPTED, Kind.HOST_LOST, Kind.FINISHED, Kind.FAILED}
    assert {k for k in kinds if Verdict(k).recover} == Kind.RECOVER
