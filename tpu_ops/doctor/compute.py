"""The doctor's Compute Engine checks: the API answers, the region's TPU quota, named (calendar) reservations."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tpu_ops.doctor.base import OK, Check, _guard, _missing, _ok
from tpu_ops.settings import Settings
from tpu_ops.tiers import Tier

if TYPE_CHECKING:
    from tpu_ops.specs import PipelineSpec


def _compute_quota(api: Any, region: str, generation: str, chips: int, spot: bool) -> Check:
    """The region's Compute Engine TPU quota for ``generation`` (a separate pool from the TPU API's)."""
    quotas = api.region_quotas(region)
    token = generation.upper()
    prefix = "PREEMPTIBLE_" if spot else ""
    metrics = {m: v for m, v in quotas.items() if "TPU" in m and token in m and m.startswith(prefix)}
    if not spot:
        metrics = {m: v for m, v in metrics.items() if not m.startswith("PREEMPTIBLE_")}
    name = f"compute quota {'spot ' if spot else ''}{generation} in {region}"
    if not metrics:
        fix = f"request Compute Engine TPU quota for {generation} in {region} (console: IAM & Admin > Quotas)"
        return _missing(name, f"no {prefix}TPU quota metric for {generation} in {region} ({len(quotas)} metrics)", fix)
    metric, (usage, limit) = sorted(metrics.items())[0]
    free = limit - usage
    detail = f"{metric}: {usage:g} of {limit:g} used, {free:g} free; the slice needs {chips}"
    if free < chips:
        return _missing(name, detail, f"request more {metric} quota in {region}, or free some")
    return _ok(name, detail)


def compute_checks(settings: Settings, spec: PipelineSpec) -> list[Check]:
    """Compute Engine: the API answers, the region's TPU quota covers the slice, named reservations exist."""
    from tpu_ops.cloud.compute import ComputeApi

    sl = spec.provision.slice
    acc = sl.accelerator
    enable = "gcloud services enable compute.googleapis.com; grant infra/iam/gcp/tpu_ops_flows.yaml (compute.*)"
    out: list[Check] = []
    api = ComputeApi(settings)

    def reachable() -> Check:
        api.region_quotas(sl.region)
        return _ok("compute api", f"regions.get {sl.region} answers (backend compute: {sl.backend_reason})")

    out += _guard("compute api", enable, reachable)
    if out[-1].status != OK:
        return out
    kinds = {getattr(r, "kind", "") for r in spec.provision.ladder}
    if kinds - {Tier.SPOT}:
        out += _guard(f"compute quota {acc.generation}", enable,
                      lambda: _compute_quota(api, sl.region, acc.generation, acc.chips, False))  # fmt: skip
    if Tier.SPOT in kinds:
        out += _guard(f"compute quota spot {acc.generation}", enable,
                      lambda: _compute_quota(api, sl.region, acc.generation, acc.chips, True))  # fmt: skip
    for rung in spec.provision.ladder:
        if getattr(rung, "kind", "") == Tier.RESERVATION:
            name, zone = str(rung.short_name), str(rung.zone)
            label = f"reservation {name} in {zone}"

            def res(n: str = name, z: str = zone, label: str = label) -> Check:
                create = (f"gcloud compute reservations create {n} --zone={z} --machine-type={acc.machine_type} "
                          f"--vm-count={acc.hosts}")  # fmt: skip
                held = api.reservation_vms(z, n)
                if held is None:
                    return _missing(label, "not found", create)
                count, machine = held
                have, need = f"{count} x {machine}", f"{acc.hosts} x {acc.machine_type}"
                if count < acc.hosts or machine != acc.machine_type:
                    return _missing(label, f"holds {have}, smaller than the slice ({sl.accelerator_type}: {need})",
                                    f"a reservation of {need} ({create}), or a slice that fits it")  # fmt: skip
                return _ok(label, f"holds {have}; the slice needs {need}")

            out += _guard(label, enable, res)
        elif getattr(rung, "kind", "") == Tier.CALENDAR:
            name, zone = str(rung.short_name), str(rung.zone)

            def cal(n: str = name, z: str = zone) -> Check:
                return _calendar(settings, n, z)

            out += _guard(f"calendar reservation {name} in {zone}", enable, cal)
    return out


def _calendar(settings: Settings, name: str, zone: str) -> Check:
    """A calendar rung's future reservation exists, is in calendar mode, will deliver (not declined or
    failed by Google) and its window has not ended."""
    import time

    from tpu_ops.cloud.compute_resize import ComputeResizeApi
    from tpu_ops.provision.calendar import REFUSALS, when

    label = f"calendar reservation {name} in {zone}"
    fr = ComputeResizeApi(settings).get_future_reservation(zone, name)
    if fr is None or fr.mode != "CALENDAR":
        why = "not found" if fr is None else f"a future reservation in {fr.mode} mode, not calendar"
        return _missing(label, why, f"book one (it can be cancelled before it is provisioned, which spares its "
                        f"charges): gcloud compute future-reservations create {name} --zone={zone} "
                        f"--reservation-mode=calendar ...")  # fmt: skip
    window = f"window {when(fr.start)} - {when(fr.end)}, {fr.status}"
    if fr.status in REFUSALS:  # Google declined or failed it (or it was cancelled, or never submitted)
        return _missing(label, f"{window}: {REFUSALS[fr.status][1]}", "book another window or zone and name it")
    if fr.end is not None and fr.end <= time.time():
        return _missing(label, f"{window}: ended", "name a calendar reservation whose window is still ahead")
    return _ok(label, window)
