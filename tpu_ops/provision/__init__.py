"""Provisioning: the capacity ladder over queued resources, teardown, the reaper, cost.

slice = provision(spec, run_id, settings)      # adopts the run's live slice if there is one
teardown(run_id, settings)                     # force-delete and confirm gone
with slice_for(spec, run_id, settings) as s:   # always torn down
    ...
"""

from tpu_ops.provision.ladder import plan, provision, recover, slice_for
from tpu_ops.provision.records import Attempt, Outcome, Resource, Slice, TeardownReport
from tpu_ops.provision.teardown import find_resources, teardown

__all__ = [
    "Attempt",
    "Outcome",
    "Resource",
    "Slice",
    "TeardownReport",
    "find_resources",
    "plan",
    "provision",
    "recover",
    "slice_for",
    "teardown",
]
