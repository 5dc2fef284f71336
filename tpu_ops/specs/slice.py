"""Specs for a TPU slice, the capacity ladder, and a provisioning request."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from tpu_ops.accelerators import (
    ACCELERATOR_TYPES,
    COMPUTE_IMAGES,
    RUNTIME_VERSIONS,
    AcceleratorType,
    Shape,
    canonical,
    known_names,
    lookup,
    parse_shape,
    smaller_shapes,
)
from tpu_ops.specs.choose import ChooseSpec, expand_auto
from tpu_ops.specs.common import Duration, Labels, StrictModel, Usd
from tpu_ops.tiers import BACKEND_GENERATIONS, BACKEND_TIERS, Backend, Tier

_REGION = re.compile(r"^[a-z]+-[a-z]+[0-9]+$")
_ZONE = re.compile(r"^([a-z]+-[a-z]+[0-9]+)-[a-z]$")
_RUNTIME = re.compile(r"^[a-z0-9][a-z0-9.-]{0,62}$")
_RESERVATION = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
_RESERVATION_PATH = re.compile(r"^projects/([a-z][-a-z0-9]{4,28}[a-z0-9])/zones/([a-z0-9-]+)/reservations/(.+)$")


def _check_accelerator(value: str) -> str:
    if value not in ACCELERATOR_TYPES:
        raise ValueError(f"unknown accelerator type {value!r}; allowed: {', '.join(known_names())}")
    return value


def _normalise_accelerator(value: Any) -> Any:
    return canonical(value) if isinstance(value, str) else value  # v5e-16 → v5litepod-16 (validate says so)


AcceleratorName = Annotated[
    str,
    BeforeValidator(_normalise_accelerator),
    AfterValidator(_check_accelerator),
    Field(json_schema_extra={"enum": known_names()}),
]


def _check_region(value: str) -> str:
    if not _REGION.fullmatch(value):
        raise ValueError(f"{value!r} is not a region name like 'us-central2'")
    return value


def _check_zone(value: str) -> str:
    if not _ZONE.fullmatch(value):
        raise ValueError(f"{value!r} is not a zone name like 'us-central2-b'")
    return value


Region = Annotated[str, AfterValidator(_check_region)]
Zone = Annotated[str, AfterValidator(_check_zone)]


# The optional fields each tier uses (the others must stay empty), and those it needs. A new tier is
# one ``Tier`` value plus its row here and, if it has any, its optional fields on ``Rung``; a tier
# with no row uses no field.
TIER_FIELDS: dict[str, frozenset[str]] = {
    Tier.RESERVATION: frozenset({"name", "zone"}),
    Tier.FLEX_START: frozenset({"max_run_duration"}),
    Tier.CALENDAR: frozenset({"name", "zone", "max_run_duration"}),
}
TIER_REQUIRES: dict[str, frozenset[str]] = {Tier.RESERVATION: frozenset({"name"}), Tier.CALENDAR: frozenset({"name"})}
NAMED_TIERS = (Tier.RESERVATION, Tier.CALENDAR)  # rungs that name a reservation in one zone
# every optional field of a rung (a new tier's fields are added here too)
RUNG_FIELDS = ("name", "zone", "max_run_duration")
FLEX_START_DEFAULT_RUN = timedelta(days=1)


class Rung(StrictModel):
    """One rung of the capacity ladder: a capacity tier, and what that tier needs (a reservation: its
    name and zone)."""

    model_config = ConfigDict(title="Rung", use_enum_values=False)
    # Prefect's form shows every field of a rung whatever its kind (a union per tier would make each
    # rung a raw JSON editor), so each field's title names the tiers that use it; `_check` refuses the rest.
    kind: Tier = Field(
        Tier.SPOT,
        title="Kind (capacity tier)",
        description="The capacity tier this rung asks for: reservation, spot, on-demand, or flex-start "
        "(Compute Engine only: queued capacity for a bounded run).",
    )
    name: str | None = Field(
        None,
        title="Reservation name (reservation, calendar rungs)",
        description="Reservation rungs: the reservation's name, or its full path "
        "(projects/PROJECT/zones/ZONE/reservations/NAME). Calendar rungs: the calendar-mode future reservation's "
        "name (its window is read from Compute Engine).",
        json_schema_extra={"examples": ["fraud-v4-reservation"]},
    )
    zone: Zone | None = Field(
        None,
        title="Reservation zone (reservation, calendar rungs)",
        description="Reservation and calendar rungs: the reservation's zone, e.g. us-central2-b (taken from a "
        "full path if given).",
    )
    max_run_duration: Duration(timedelta(minutes=10), timedelta(days=7)) | None = Field(  # type: ignore[valid-type]
        None,
        title="Max run duration (flex-start, calendar rungs)",
        description="Flex-start (and calendar) rungs: how long the slice may run before Compute Engine deletes "
        "it (maxRunDuration, a resize request's requestedRunDuration; default 1 day).",
    )

    @model_validator(mode="after")
    def _check(self) -> Rung:
        used = TIER_FIELDS.get(self.kind, frozenset())
        for field in RUNG_FIELDS:
            if getattr(self, field) is not None and field not in used:
                raise ValueError(f"{field} is not used by a {self.kind} rung; leave it empty")
        for field in sorted(TIER_REQUIRES.get(self.kind, frozenset())):
            if getattr(self, field) is None:
                raise ValueError(f"a {self.kind} rung needs its {field}")
        if self.kind in NAMED_TIERS:
            self._check_reservation()
        if self.kind in (Tier.FLEX_START, Tier.CALENDAR) and self.max_run_duration is None:
            object.__setattr__(self, "max_run_duration", FLEX_START_DEFAULT_RUN)
        return self

    def _check_reservation(self) -> None:
        assert self.name is not None
        m = _RESERVATION_PATH.fullmatch(self.name)
        if m:
            if self.zone is not None and self.zone != m.group(2):
                raise ValueError(f"reservation {self.name!r} is in zone {m.group(2)!r}, not {self.zone!r}")
            object.__setattr__(self, "zone", _check_zone(m.group(2)))
            leaf = m.group(3)
        else:
            leaf = self.name
        if not _RESERVATION.fullmatch(leaf):
            raise ValueError(f"reservation name {leaf!r} is not allowed: lowercase letters, digits, '-', ≤ 63")
        if self.zone is None:
            raise ValueError(f"reservation {self.name!r} needs a zone (a reservation belongs to one zone)")

    @property
    def short_name(self) -> str:
        """The reservation's own name (the last part of a full path); empty for other tiers."""
        return (self.name or "").rsplit("/", 1)[-1]


def _rung_shorthand(value: Any) -> Any:
    """Accept a tier's name (``"spot"``, ``"on-demand"``) and ``"reservation:NAME@ZONE"`` as well as objects."""
    if isinstance(value, str):
        for tier in NAMED_TIERS:
            if value.startswith(f"{tier}:"):
                name, _, zone = value.removeprefix(f"{tier}:").partition("@")
                return {"kind": tier, "name": name, "zone": zone or None}
        if value in {t.value for t in Tier} and value not in NAMED_TIERS:
            return {"kind": value}
        raise ValueError(
            f"rung {value!r} is not allowed: '{Tier.RESERVATION}:NAME@ZONE', '{Tier.CALENDAR}:NAME@ZONE' or one of "
            f"{Tier.names()}"
        )
    if isinstance(value, dict) and "kind" not in value:
        raise ValueError(f"a rung needs its kind: {Tier.names()}")
    return value


RungOrShorthand = Annotated[Rung, BeforeValidator(_rung_shorthand)]


def _check_ladder(rungs: list[Any]) -> list[Any]:
    seen: set[tuple[str, str, str]] = set()
    for rung in rungs:
        ident = (rung.kind, getattr(rung, "short_name", ""), getattr(rung, "zone", "") or "")
        if ident in seen:
            raise ValueError(f"duplicate rung {rung.kind}{' ' + ident[1] if ident[1] else ''} in the ladder")
        seen.add(ident)
    return rungs


CapacityLadder = Annotated[
    list[RungOrShorthand],
    Field(min_length=1, max_length=10),
    AfterValidator(_check_ladder),
]


class SliceSpec(StrictModel):
    """A TPU slice: its shape, software, and where it may run."""

    accelerator_type: AcceleratorName = Field(
        description="e.g. v4-32, v5litepod-16 (v5e-16 is read as v5litepod-16), v5p-128, v6e-8, tpu7x-128"
    )
    backend: Literal["auto", "compute", "tpu-api"] = Field(
        "auto",
        description="Control plane: 'compute' (Compute Engine instances / instance groups), 'tpu-api' (Cloud "
        "TPU API queued resources, frozen by Google), or 'auto': Compute Engine for v5p, v6e and TPU7x, the "
        "TPU API for v4 and v5e.",
    )
    runtime_version: str | None = Field(
        None, description="TPU VM runtime (TPU API) or boot image family (Compute Engine); defaults per generation."
    )
    region: Region = Field(description="e.g. us-central2")
    zones: list[Zone] = Field(min_length=1, max_length=8, description="Zones to try, in order.")
    labels: Labels = Field(
        default_factory=dict, description="GCP labels for the slice: lowercase keys and values, ≤ 63 characters."
    )
    network: str | None = Field(
        None, pattern=r"^[a-z]([-a-z0-9/]{0,200}[a-z0-9])?$", description="VPC network; default: the project's."
    )
    service_account: str | None = Field(
        None,
        pattern=r"^[a-z0-9-]+@[a-z0-9.-]+\.iam\.gserviceaccount\.com$",
        description="Service account email the TPU VMs run as; default: the compute default.",
    )
    slices: int = Field(
        1,
        ge=1,
        le=64,
        description="Slices in the run's allocation (multislice: JAX joins them over the data-center network). "
        "All of them are obtained, in one zone, before training starts, and given back together.",
    )
    keep_healthy_for: Duration(timedelta(0), timedelta(hours=6)) = Field(  # type: ignore[valid-type]
        timedelta(minutes=5),
        description="Multislice: how long the healthy slices are kept (and billed) while a lost one is replaced; "
        "past it, the whole allocation is given back and a new one obtained.",
    )

    shapes: list[str] | None = Field(
        None,
        min_length=1,
        max_length=8,
        description="Elastic shapes (docs/elastic.md): the shapes the run may train on, the target first (this "
        "slice's own: accelerator_type, or 'NxTYPE' with slices: N), then smaller ones of the same generation whose "
        "chips divide the target's, e.g. [v5p-32, v5p-16, 2xv5p-8]. A smaller shape is asked for only when the "
        "target cannot be had; the job contract keeps the global batch (TPU_OPS_ACCUM_STEPS). Default: only the "
        "target.",
    )

    @field_validator("shapes")
    @classmethod
    def _check_shapes(cls, value: list[str] | None, info: ValidationInfo) -> list[str] | None:
        if value is None or "accelerator_type" not in info.data:
            return value
        target = Shape(lookup(info.data["accelerator_type"]), int(info.data.get("slices") or 1))
        allowed = smaller_shapes(target)
        names: list[str] = []
        for i, text in enumerate(value):
            try:
                name = parse_shape(text).name
            except ValueError:
                name = ""
            if i == 0 and name != target.name:
                raise ValueError(f"shapes[0] must be the target shape {target.name!r} (accelerator_type, slices)")
            if name not in allowed:
                raise ValueError(
                    f"shapes[{i}] {text!r} is not a shape a {target.name} run can keep its global batch on "
                    f"(same generation, chips dividing {target.chips}); allowed: {', '.join(allowed)}"
                )
            names.append(name)
        if len(set(names)) != len(names):
            raise ValueError(f"shapes {value} has duplicates")
        return names

    @property
    def shape_list(self) -> list[Shape]:
        """The shapes the run may train on, target first (only the target when ``shapes`` is unset)."""
        return [parse_shape(n) for n in self.shapes or [Shape(self.accelerator, self.slices).name]]

    @model_validator(mode="after")
    def _check(self) -> SliceSpec:
        for zone in self.zones:
            if not zone.startswith(self.region + "-"):
                raise ValueError(f"zone {zone!r} is not in region {self.region!r}")
        if len(set(self.zones)) != len(self.zones):
            raise ValueError(f"zones {self.zones} has duplicates")
        if self.runtime_version is not None and not _RUNTIME.fullmatch(self.runtime_version):
            raise ValueError(f"runtime_version {self.runtime_version!r} is not a valid image name")
        return self

    @property
    def accelerator(self) -> AcceleratorType:
        return lookup(self.accelerator_type)

    @property
    def resolved_backend(self) -> Backend:
        """The control plane this slice is provisioned through (``auto`` decided by generation)."""
        return backend_choice(self.backend, self.accelerator.generation)[0]

    @property
    def backend_reason(self) -> str:
        """Why that control plane, in words (the plan prints it)."""
        return backend_choice(self.backend, self.accelerator.generation)[1]

    @property
    def runtime(self) -> str:
        """The runtime version (TPU API) or image family (Compute Engine) to boot: the spec's, or the default."""
        if self.runtime_version:
            return self.runtime_version
        gen = self.accelerator.generation
        if self.resolved_backend == Backend.COMPUTE:
            return COMPUTE_IMAGES[gen]
        return RUNTIME_VERSIONS[gen][0]


def backend_choice(requested: str, generation: str) -> tuple[Backend, str]:
    """``(backend, why)`` for a spec's ``backend`` and a TPU generation."""
    if requested != "auto":
        return Backend(requested), f"the spec asks for backend {requested!r}"
    if generation in BACKEND_GENERATIONS[Backend.COMPUTE]:
        return Backend.COMPUTE, (
            f"auto: {generation} is offered on Compute Engine, Google's current control plane for TPUs "
            "(the Cloud TPU API gets fixes only)"
        )
    return Backend.TPU_API, f"auto: Compute Engine does not offer {generation}; only the Cloud TPU API does"


class ProvisionSpec(StrictModel):
    """Provision one slice through the capacity ladder, within a budget."""

    slice: SliceSpec
    ladder: CapacityLadder = Field(
        description="Rungs tried in order, e.g. reservation, spot, flex-start (Compute Engine only), on-demand. "
        'Each rung is an object: {"kind": "spot"}, {"kind": "reservation", "name": "NAME", '
        '"zone": "ZONE"}; spec files may also write `spot` or `reservation:NAME@ZONE`.'
    )
    budget_usd: Usd = Field(description="Refuse to provision if the cost estimate exceeds this.")
    hours: float = Field(gt=0, le=24 * 90, description="Expected hours of use, for the estimate.")
    queue_timeout: Duration(timedelta(seconds=1), timedelta(days=7)) = Field(  # type: ignore[valid-type]
        timedelta(minutes=30),
        description="How long one rung's request may wait for capacity before the ladder moves on (on the "
        "Cloud TPU API, the queued resource's validUntilDuration).",
    )
    overall_timeout: Duration(timedelta(seconds=1), timedelta(days=14)) = Field(  # type: ignore[valid-type]
        timedelta(hours=2), description="How long the whole ladder may take."
    )
    quota_limit: str | None = Field(
        None, pattern=r"^[a-z][-a-z0-9_]{0,62}$", description="Prefect global concurrency limit held in chips."
    )
    choose: ChooseSpec | None = Field(
        None, description="Rank the rungs by expected $ per kept step (`ladder: auto` sets it); none: written order."
    )

    _auto = model_validator(mode="before")(expand_auto)  # `ladder: auto` (tpu_ops/specs/choose.py)

    @model_validator(mode="after")
    def _check(self) -> ProvisionSpec:
        backend, gen = self.slice.resolved_backend, self.slice.accelerator.generation
        if gen not in BACKEND_GENERATIONS[backend]:
            raise ValueError(
                f"backend {backend.value!r} cannot serve {self.slice.accelerator_type} ({gen}); it serves "
                f"{', '.join(sorted(BACKEND_GENERATIONS[backend]))}"
            )
        for i, rung in enumerate(self.ladder):
            if rung.kind not in BACKEND_TIERS[backend]:
                raise ValueError(
                    f"ladder[{i}] ({rung.kind}) cannot be served by backend {backend.value!r}; it serves "
                    f"{', '.join(sorted(BACKEND_TIERS[backend]))}"
                )
        for rung in self.ladder:
            if rung.kind in NAMED_TIERS and rung.zone not in self.slice.zones:
                raise ValueError(
                    f"reservation {rung.short_name!r} is in zone {rung.zone!r}, which is not one of the "
                    f"slice's zones {self.slice.zones}"
                )
        return self
