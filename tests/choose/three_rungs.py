"""The three rungs the fleet tests rank (a reservation in zone a, spot and on-demand in b) and their history."""

from __future__ import annotations

from tpu_ops.provision.choose import History, Rung

A, B = "us-east5-a", "us-east5-b"
RES = Rung("v5p-8", A, "reservation", "compute", 0.0, "team-res", 1, 16.8)
SPOT = Rung("v5p-8", B, "spot", "compute", 8.4, "", 2, 16.8)
OD = Rung("v5p-8", B, "on-demand", "compute", 16.8, "", 3, 16.8)
SEEN = {
    RES.key: History(hours=10.0, obtained=5),
    SPOT.key: History(hours=10.0, preemptions=5, obtained=5),
    OD.key: History(hours=10.0, obtained=5),
}
