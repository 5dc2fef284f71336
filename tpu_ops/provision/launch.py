"""What the hosts of an allocation boot with: one :class:`Launch`, rendered by each provider for its plane.

The start-up script (the agent, :func:`tpu_ops.startup.render_startup_script`) and the metadata beside
it are the same on every slice but for the slice's index (``tpu-ops-slice``), which tells the agent
where it is in the allocation. The Cloud TPU API provider puts ``metadata(i)`` on the node, the Compute
Engine provider into the instance template of slice ``i``'s instance or group. A single-slice run boots
with the start-up script alone, as it always did.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

SLICE_KEY: Final = "tpu-ops-slice"  # the agent reads it (tpu_ops.agent.run); absent: slice 0 of 1


@dataclass(frozen=True)
class Launch:
    """The start-up of every host of a ``slices``-slice allocation."""

    script: str
    slices: int = 1
    extra: Mapping[str, str] = field(default_factory=dict)

    def metadata(self, slice_index: int) -> dict[str, str]:
        """Slice ``slice_index``'s metadata (what the provider's create request carries)."""
        if not 0 <= slice_index < self.slices:
            raise ValueError(f"slice {slice_index} is outside an allocation of {self.slices}")
        md = {"startup-script": self.script, **self.extra}
        if self.slices > 1:
            md[SLICE_KEY] = str(slice_index)
        return md
