"""The Compute Engine machine types of TPU VMs (see /work/shared/CLOUD-FACTS.md "Compute Engine TPUs")."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MachineType:
    name: str
    generation: str  # v5p, v6e, tpu7x
    chips: int
    cpus: int
    memory_mb: int

    def accelerator_type(self, hosts: int) -> str:
        """The slice's TPU API name: v5p and TPU7x names count TensorCores (2 per chip), v6e chips."""
        chips = self.chips * hosts
        return f"{self.generation}-{chips * 2 if self.generation in ('v5p', 'tpu7x') else chips}"

    @property
    def quota_metric(self) -> str:
        # Not in the compute.v1 discovery enum (it lists TPU quotas only up to v5e); the names are ours.
        return f"TPU_PODSLICE_{self.generation.upper()}"


MACHINE_TYPES: dict[str, MachineType] = {
    m.name: m
    for m in (
        MachineType("ct5p-hightpu-4t", "v5p", 4, 208, 448 * 1024),
        MachineType("ct6e-standard-1t", "v6e", 1, 44, 176 * 1024),
        MachineType("ct6e-standard-4t", "v6e", 4, 180, 720 * 1024),
        MachineType("ct6e-standard-8t", "v6e", 8, 180, 1440 * 1024),
        MachineType("tpu7x-standard-4t", "tpu7x", 4, 224, 960 * 1024),
    )
}
