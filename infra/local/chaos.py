"""Inject a spot preemption into a run on the local stack, over the fakes' control endpoints.

What ``tpu-ops local preempt RUN`` and the served flows' ``inject_preemption`` use: the run's slices
are found through its provider (as teardown finds them), and one is preempted the way spot capacity
would take it — a Cloud TPU API node goes PREEMPTED (its workers get SIGTERM); on Compute Engine one
host of the slice is preempted (SIGTERM, then gone after the notice), which loses the whole slice.
Only endpoints on loopback are ever called (``Settings.check_safe``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from urllib.parse import quote

from infra.local._proc import http_call
from tpu_ops.errors import ConfigError
from tpu_ops.provision.providers import SliceState, for_spec
from tpu_ops.provision.providers.base import SliceRecord
from tpu_ops.settings import Settings
from tpu_ops.specs import ProvisionSpec


def running_slices(
    settings: Settings, spec: ProvisionSpec, run_id: str, zones: Sequence[str] = ()
) -> list[SliceRecord]:
    """The run's slices with every host up, in a stable order (by id); a TPU API multislice request's slices
    are its nodes (``parts``), each preempted alone."""
    provider = for_spec(spec, settings)
    found = [p for s in provider.slices(list(zones or spec.slice.zones), run_id) for p in (s.parts or (s,))]
    return sorted((s for s in found if s.state in SliceState.RUNNING), key=lambda s: s.slice_id)


def require_local(settings: Settings) -> None:
    """Refuse (``ConfigError`` with the fix) unless the settings point at the local stack."""
    if not settings.dry_run:
        refused = ConfigError("preempting a slice is for the local stack only (TPU_OPS_DRY_RUN=true)")
        refused.fix = "load the file `tpu-ops local up --env-file FILE` wrote: set -a; . FILE; set +a"
        raise refused


def preempt(settings: Settings, rec: SliceRecord) -> str:
    """Preempt ``rec`` on the local fakes; what was preempted, in words."""
    require_local(settings)
    settings.check_safe("tpu_endpoint" if rec.backend == "tpu-api" else "compute_endpoint")  # loopback only
    project = quote(settings.gcp_project or "", safe="")
    if rec.backend == "tpu-api":
        base = settings.tpu_endpoint
        path = f"/_fake/nodes/{quote(rec.zone)}/{quote(rec.slice_id)}:preempt"
        what = f"node {rec.slice_id} in {rec.zone}"
    else:  # one host: a multi-host slice on Compute Engine is lost, and recreated, whole
        base = settings.compute_endpoint
        host = sorted(rec.hosts, key=lambda h: h.index)[-1].name.split(".")[0] if rec.hosts else rec.slice_id
        path = f"/_fake/zones/{quote(rec.zone)}/instances/{quote(host)}:preempt"
        what = f"host {host} of {rec.slice_id} in {rec.zone}"
    http_call(f"{str(base).rstrip('/')}{path}?project={project}", "POST", json.dumps({}).encode())
    return what
