"""The plan document of a ranking, field by field and with its rounding, against what mutation
testing of ``provision/choose.py`` left alive (docs/mutation-testing.md). No server."""

from __future__ import annotations

import math

from tpu_ops.provision.choose import Choice, History, Ranked, Rung, RunModel, expect, rank

SPOT = Rung("v5p-32", "us-east5-a", "spot", "compute", 96.0, order=1, fallback_usd_per_hour=192.0)
RES = Rung("v5p-32", "us-east5-b", "reservation", "compute", 0.0, reservation="res-a", order=0)
# figures with more places than the plan keeps: 1.23456 h seen, one preemption, 3 slices obtained in
# 101.2345 s, one refusal
ODD = History(hours=1.23456, preemptions=1, obtained=3, obtain_s_total=101.2345, stockouts=1)


def test_a_rung_s_label_names_its_reservation() -> None:
    assert RES.label() == "reservation res-a in us-east5-b"
    assert SPOT.label() == "spot in us-east5-a"


def test_an_expectation_s_document_keeps_its_figures_to_their_places() -> None:
    e = expect(SPOT, RunModel(1000, 3.6, 100, deadline_s=4000.0), ODD)
    doc = e.to_json()
    assert doc["rate_per_hour"] == round((1 + 0.5 * 4) / (1.23456 + 4), 6) == 0.573114  # 6 places, not 7
    assert doc["history_hours"] == 1.235  # 3 places
    assert doc["obtain_s"] == round((101.2345 + 300.0 * 2) / (3 + 2), 3) == 140.247
    assert doc["recovery_s"] == 300.0
    assert doc["full"] == round(1 / (1 + 3 + 2), 6)
    assert 0.1 < e.miss_probability < 1.0 and round(e.miss_probability, 7) != round(e.miss_probability, 6)
    assert doc["miss_probability"] == round(e.miss_probability, 6)
    assert doc["usd"] == round(e.held_s / 3600.0 * 96.0, 6)
    assert doc["scarcity_usd"] == round(e.held_s / 3600.0 * (1 / 6) * (192.0 - 96.0), 6)
    assert doc["usd_per_step"] == round((e.usd + e.scarcity_usd) / 1000, 6)
    assert set(doc) == {
        "accelerator_type", "zone", "tier", "backend", "usd_per_hour", "reservation", "order",
        "fallback_usd_per_hour", "rate_per_hour", "history_hours", "obtain_s", "recovery_s", "held_s", "wall_s",
        "preemptions", "usd", "full", "scarcity_usd", "usd_per_step", "miss_probability",
    }  # fmt: skip


def test_a_never_finishing_rung_writes_none_for_its_endless_figures() -> None:
    e = expect(SPOT, RunModel(1000, 3.6, 100), History(hours=1.0, preemptions=100_000))
    assert math.isinf(e.held_s)
    doc = e.to_json()
    assert (doc["held_s"], doc["wall_s"], doc["usd"], doc["usd_per_step"]) == (None, None, None, None)


def test_a_choice_s_document_has_its_method_and_note() -> None:
    choice = rank([SPOT], RunModel(1000, 3.6, 100), {SPOT.key: ODD})
    doc = choice.to_json()
    assert (doc["method"], doc["note"]) == ("cost", "ranked by expected $ per kept step over 1000 steps")
    assert (doc["try_now"], doc["wait_s"]) == (None, None)
    assert [(r["position"], r["eligible"], r["tier"]) for r in doc["rungs"]] == [(1, True, "spot")]
    bare = Choice((Ranked(choice.ranked[0].expectation, 1, False, "why"),), "written-order", "n", 1, 60.0)
    assert {k: v for k, v in bare.to_json().items() if k != "rungs"} == {
        "method": "written-order", "note": "n", "try_now": 1, "wait_s": 60.0}  # fmt: skip
    assert bare.to_json()["rungs"][0]["why"] == "why"
