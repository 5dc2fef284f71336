"""Provisioning: the capacity ladder through a provider (Cloud TPU API or Compute Engine),
the slice lease, teardown, the reaper, cost.

slice = provision(spec, run_id, settings)      # adopts the run's live slice if there is one
teardown(run_id, settings)                     # delete on every control plane and confirm gone
with SliceLease(spec, run_id, settings) as lease:  # acquire / release (again after a loss)
    ...
with slice_for(spec, run_id, settings) as s:   # always torn down
    ...
"""

from tpu_ops.provision.ladder import plan, provision, recover
from tpu_ops.provision.lease import SliceLease, slice_for
from tpu_ops.provision.records import Attempt, Outcome, Resource, Slice, TeardownReport
from tpu_ops.provision.teardown import find_resources, teardown

__all__ = [
    "Attempt",
    "Outcome",
    "Resource",
    "Slice",
    "SliceLease",
    "TeardownReport",
    "find_resources",
    "plan",
    "provision",
    "recover",
    "slice_for",
    "teardown",
]
