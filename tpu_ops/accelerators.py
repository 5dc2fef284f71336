"""The one table of TPU accelerator types tpu-ops knows.

Naming follows Cloud TPU: the suffix counts TensorCores for v2-v4, v5p and TPU7x (two per chip),
and chips for v5e (``v5litepod``) and v6e (one TensorCore per chip). Hosts are the worker VMs of a
slice, which is what ``len(node.networkEndpoints)`` reports at run time.

``machine_type`` is the Compute Engine machine type of each host (empty where Compute Engine does
not offer the generation: v4, v5e). A multi-host slice uses the 4-chip type, hosts = chips / 4,
and its ``topology`` is the workload policy's ``acceleratorTopology``.

``peak_tflops_per_chip`` is Google's published bf16 peak of one chip (``PEAK_BF16_TFLOPS``, with
its sources); a slice's peak (``peak_flops``) is what model FLOPs utilisation (MFU) divides by.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final


@dataclass(frozen=True, slots=True)
class AcceleratorType:
    """One row of the table: a TPU slice shape."""

    name: str
    generation: str
    chips: int
    hosts: int
    topology: str
    cores_per_chip: int
    machine_type: str = ""
    peak_tflops_per_chip: float = 0.0  # bf16, Google's published figure (PEAK_BF16_TFLOPS)

    @property
    def chips_per_host(self) -> int:
        return self.chips // self.hosts

    @property
    def peak_flops(self) -> float:
        """The slice's bf16 peak in FLOP/s: chips * the per-chip peak."""
        return self.chips * self.peak_tflops_per_chip * 1e12


# Peak compute per chip (bf16), in TFLOP/s, as Google publishes it in the Cloud TPU documentation's
# system-architecture tables: "TPU v4" (275), "TPU v5e" and "TPU v6e" (197 and 918, v6e's table
# compares both), "TPU v5p" (459), "TPU7x (Ironwood)" (2307 bf16; its 4614 is FP8). Checked 2026-11.
PEAK_BF16_TFLOPS: Final[dict[str, float]] = {"v4": 275.0, "v5e": 197.0, "v5p": 459.0, "v6e": 918.0, "tpu7x": 2307.0}
PEAK_SOURCE: Final = "Google Cloud TPU docs, per-chip bf16 peak (pages: TPU v4, TPU v5e, TPU v5p, TPU v6e, TPU7x)"


def _rows() -> dict[str, AcceleratorType]:
    rows: dict[str, AcceleratorType] = {}

    def add(gen: str, prefix: str, suffix: int, chips: int, hosts: int, topo: str, cores: int, mt: str = "") -> None:
        name = f"{prefix}-{suffix}"
        rows[name] = AcceleratorType(name, gen, chips, hosts, topo, cores, mt, PEAK_BF16_TFLOPS[gen])

    # v4, v5p and TPU7x: 4 chips per host, 2 TensorCores per chip, 3-D torus.
    cube = {4: "2x2x1", 8: "2x2x2", 16: "2x2x4", 32: "2x4x4", 64: "4x4x4", 128: "4x4x8", 256: "4x8x8"}
    host4 = (("v4", "v4", ""), ("v5p", "v5p", "ct5p-hightpu-4t"), ("tpu7x", "tpu7x", "tpu7x-standard-4t"))
    for gen, prefix, mt in host4:
        for chips, topo in cube.items():
            add(gen, prefix, chips * 2, chips, max(1, chips // 4), topo, 2, mt)
    # v5e: 8 chips per host (v5litepod-16 = 2 hosts of 8 chips), 2-D torus.
    flat = {1: "1x1", 4: "2x2", 8: "2x4", 16: "4x4", 32: "4x8", 64: "8x8", 128: "8x16", 256: "16x16"}
    for chips, topo in flat.items():
        add("v5e", "v5litepod", chips, chips, max(1, chips // 8), topo, 1)
    # v6e: single-host up to 8 chips, multi-host slices use 4 chips per host.
    for chips, topo in flat.items():
        hosts = 1 if chips <= 8 else chips // 4
        add("v6e", "v6e", chips, chips, hosts, topo, 1, f"ct6e-standard-{chips}t" if hosts == 1 else "ct6e-standard-4t")
    return rows


ACCELERATOR_TYPES: Final[dict[str, AcceleratorType]] = _rows()
# Names people use that the APIs do not: Google's docs and prices call the generation v5e, while the
# TPU API (and the table) names its slices ``v5litepod-N``.
ALIASES: Final[dict[str, str]] = {
    f"v5e-{row.chips}": name for name, row in ACCELERATOR_TYPES.items() if row.generation == "v5e"
}
GENERATIONS: Final[tuple[str, ...]] = ("v4", "v5e", "v5p", "v6e", "tpu7x")

# Runtime versions Cloud TPU offers per generation (the fake API serves these too).
RUNTIME_VERSIONS: Final[dict[str, tuple[str, ...]]] = {
    "v4": ("tpu-ubuntu2204-base", "tpu-vm-v4-base"),
    "v5e": ("v2-alpha-tpuv5-lite", "tpu-ubuntu2204-base"),
    "v5p": ("v2-alpha-tpuv5", "tpu-ubuntu2204-base"),
    "v6e": ("v2-alpha-tpuv6e",),
    "tpu7x": (),  # Compute Engine only: no TPU API runtime
}

# Compute Engine boot image families (project ``ubuntu-os-accelerator-images``) per generation.
# Google documents the ``ubuntu-accel-2204-amd64-tpu-*`` families (22.04, Python 3.10) and
# ``ubuntu-accel-2404-amd64-tpu-tpu7x`` for TPU7x; the v5p/v6e family suffixes are our reading.
COMPUTE_IMAGE_PROJECT: Final = "ubuntu-os-accelerator-images"
COMPUTE_IMAGES: Final[dict[str, str]] = {
    "v5p": "ubuntu-accel-2204-amd64-tpu-v5p",
    "v6e": "ubuntu-accel-2204-amd64-tpu-v6e",
    "tpu7x": "ubuntu-accel-2404-amd64-tpu-tpu7x",
}


def canonical(name: str) -> str:
    """The table's name for ``name`` (``v5e-16`` → ``v5litepod-16``); other names unchanged."""
    return ALIASES.get(name, name)


def alias_note(name: str) -> str:
    """One line saying ``name`` is read as its table name ("" when it is one already)."""
    if name not in ALIASES:
        return ""
    return f"{name!r} is read as {ALIASES[name]!r} (the TPU API's name for a v5e slice)"


def lookup(name: str) -> AcceleratorType:
    """Return the table row for ``name`` (an alias too); raise ``KeyError`` naming the allowed types."""
    try:
        return ACCELERATOR_TYPES[canonical(name)]
    except KeyError:
        raise KeyError(f"unknown accelerator type {name!r}; allowed: {', '.join(known_names())}") from None


def known_names() -> list[str]:
    """All accelerator type names, grouped by generation and ordered by size."""
    order = {g: i for i, g in enumerate(GENERATIONS)}
    return sorted(ACCELERATOR_TYPES, key=lambda n: (order[ACCELERATOR_TYPES[n].generation], ACCELERATOR_TYPES[n].chips))


@dataclass(frozen=True, slots=True)
class Shape:
    """What a run trains on: ``count`` slices of one accelerator type (``v5p-16``, or ``2xv5p-16`` multislice)."""

    accelerator: AcceleratorType
    count: int = 1

    @property
    def name(self) -> str:
        return self.accelerator.name if self.count == 1 else f"{self.count}x{self.accelerator.name}"

    @property
    def chips(self) -> int:
        return self.count * self.accelerator.chips

    @property
    def hosts(self) -> int:
        return self.count * self.accelerator.hosts


def parse_shape(text: str) -> Shape:
    """``v5p-16`` → one v5p-16 slice; ``2xv5p-16`` → two; ``ValueError`` naming the forms allowed."""
    m = re.fullmatch(r"(?:([0-9]+)x)?(.*)", text.strip())
    assert m is not None  # it matches any text; an empty name fails the lookup
    count = int(m.group(1) or 1)
    if not 1 <= count <= 64:
        raise ValueError(f"shape {text!r}: N in 'NxTYPE' counts slices, 1-64 (e.g. '2xv5p-16')")
    try:
        return Shape(lookup(m.group(2)), count)
    except KeyError as exc:
        raise ValueError(f"shape {text!r}: {exc.args[0]}") from None


def smaller_shapes(target: Shape) -> list[str]:
    """Every shape a run with ``target`` may fall back to: same generation, chips dividing the target's
    (one slice, or several alike), largest first (what an error lists as allowed)."""
    out: list[Shape] = []
    for row in ACCELERATOR_TYPES.values():
        if row.generation != target.accelerator.generation:
            continue
        for count in range(1, target.chips // row.chips + 1):
            shape = Shape(row, count)
            if shape.chips <= target.chips and target.chips % shape.chips == 0:
                out.append(shape)
    out.sort(key=lambda s: (-s.chips, s.count))
    return [s.name for s in out]
