"""Specs for a TPU slice, the capacity ladder, and a provisioning request."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BeforeValidator, ConfigDict, Discriminator, Field, Tag, model_validator

from tpu_ops.accelerators import (
    ACCELERATOR_TYPES,
    COMPUTE_IMAGES,
    RUNTIME_VERSIONS,
    AcceleratorType,
    known_names,
    lookup,
)
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


AcceleratorName = Annotated[str, AfterValidator(_check_accelerator), Field(json_schema_extra={"enum": known_names()})]


def _check_region(value: str) -> str:
    if not _REGION.match(value):
        raise ValueError(f"{value!r} is not a region name like 'us-central2'")
    return value


def _check_zone(value: str) -> str:
    if not _ZONE.match(value):
        raise ValueError(f"{value!r} is not a zone name like 'us-central2-b'")
    return value


Region = Annotated[str, AfterValidator(_check_region)]
Zone = Annotated[str, AfterValidator(_check_zone)]


class ReservationRung(StrictModel):
    """Use a named reservation in one zone (``projects/P/zones/Z/reservations/N`` is accepted too)."""

    model_config = ConfigDict(title="Reservation")
    kind: Literal[Tier.RESERVATION] = Field(Tier.RESERVATION, description="This rung uses a named reservation.")
    name: str = Field(description="Reservation name, or its full resource path.")
    zone: Zone | None = Field(None, description="The reservation's zone; taken from a full path if given.")

    @model_validator(mode="after")
    def _check(self) -> ReservationRung:
        m = _RESERVATION_PATH.match(self.name)
        if m:
            if self.zone is not None and self.zone != m.group(2):
                raise ValueError(f"reservation {self.name!r} is in zone {m.group(2)!r}, not {self.zone!r}")
            object.__setattr__(self, "zone", _check_zone(m.group(2)))
            leaf = m.group(3)
        else:
            leaf = self.name
        if not _RESERVATION.match(leaf):
            raise ValueError(f"reservation name {leaf!r} is not allowed: lowercase letters, digits, '-', ≤ 63")
        if self.zone is None:
            raise ValueError(f"reservation {self.name!r} needs a zone (a reservation belongs to one zone)")
        return self

    @property
    def short_name(self) -> str:
        return self.name.rsplit("/", 1)[-1]


class SpotRung(StrictModel):
    """Spot capacity: cheapest, preemptible, no notice."""

    model_config = ConfigDict(title="Spot")
    kind: Literal[Tier.SPOT] = Field(Tier.SPOT, description="This rung asks for spot capacity.")


class OnDemandRung(StrictModel):
    """On-demand capacity: the last resort."""

    model_config = ConfigDict(title="On-demand")
    kind: Literal[Tier.ON_DEMAND] = Field(Tier.ON_DEMAND, description="This rung asks for on-demand capacity.")


class FlexStartRung(StrictModel):
    """Compute Engine flex-start: queued capacity for a bounded run time (up to 7 days)."""

    model_config = ConfigDict(title="Flex-start")
    kind: Literal[Tier.FLEX_START] = Field(Tier.FLEX_START, description="This rung asks for flex-start capacity.")
    max_run_duration: Duration(timedelta(minutes=10), timedelta(days=7)) = Field(  # type: ignore[valid-type]
        timedelta(days=1), description="How long the slice may run before Compute Engine deletes it (maxRunDuration)."
    )


def _rung_shorthand(value: Any) -> Any:
    """Accept ``"spot"``, ``"on-demand"``, ``"flex-start"`` and ``"reservation:NAME@ZONE"`` as well as objects."""
    if isinstance(value, str):
        if value in (Tier.SPOT, Tier.ON_DEMAND, Tier.FLEX_START):
            return {"kind": value}
        if value.startswith(f"{Tier.RESERVATION}:"):
            name, _, zone = value.removeprefix(f"{Tier.RESERVATION}:").partition("@")
            return {"kind": Tier.RESERVATION, "name": name, "zone": zone or None}
        raise ValueError(
            f"rung {value!r} is not allowed: '{Tier.RESERVATION}:NAME@ZONE', '{Tier.SPOT}', '{Tier.ON_DEMAND}' "
            f"or '{Tier.FLEX_START}'"
        )
    return value


def _rung_kind(value: Any) -> str | None:
    return value.get("kind") if isinstance(value, dict) else getattr(value, "kind", None)


Rung = Annotated[
    Annotated[ReservationRung, Tag(Tier.RESERVATION)]
    | Annotated[SpotRung, Tag(Tier.SPOT)]
    | Annotated[OnDemandRung, Tag(Tier.ON_DEMAND)]
    | Annotated[FlexStartRung, Tag(Tier.FLEX_START)],
    Discriminator(
        _rung_kind,
        custom_error_type="rung_kind",
        custom_error_message=f"rung kind must be {Tier.names()}",
    ),
    BeforeValidator(_rung_shorthand),
]


def _check_ladder(rungs: list[Any]) -> list[Any]:
    seen: set[tuple[str, str, str]] = set()
    for rung in rungs:
        ident = (rung.kind, getattr(rung, "short_name", ""), getattr(rung, "zone", "") or "")
        if ident in seen:
            raise ValueError(f"duplicate rung {rung.kind}{' ' + ident[1] if ident[1] else ''} in the ladder")
        seen.add(ident)
    return rungs


_SHORTHAND = (
    rf"^({Tier.SPOT}|{Tier.ON_DEMAND}|{Tier.FLEX_START}|{Tier.RESERVATION}:"
    r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?(@[a-z]+-[a-z]+[0-9]+-[a-z])?)$"
)


def _ladder_schema(schema: dict[str, Any]) -> None:
    """One flat choice per rung: Prefect's form renders each rung model as typed fields (a nested
    union would be a raw JSON editor); the string shorthand stays valid for its server-side check."""
    items = schema.get("items")
    if isinstance(items, dict):
        models = items.get("oneOf") or items.get("anyOf") or [items]
        shorthand = {
            "type": "string",
            "pattern": _SHORTHAND,
            "title": f"{Tier.SPOT} | {Tier.ON_DEMAND} | {Tier.FLEX_START} | {Tier.RESERVATION}:NAME@ZONE",
        }
        schema["items"] = {"anyOf": [*models, shorthand]}


CapacityLadder = Annotated[
    list[Rung],
    Field(min_length=1, max_length=10, json_schema_extra=_ladder_schema),
    AfterValidator(_check_ladder),
]


class SliceSpec(StrictModel):
    """A TPU slice: its shape, software, and where it may run."""

    accelerator_type: AcceleratorName = Field(description="e.g. v4-32, v5litepod-16, v5p-128, v6e-8, tpu7x-128")
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

    @model_validator(mode="after")
    def _check(self) -> SliceSpec:
        for zone in self.zones:
            if not zone.startswith(self.region + "-"):
                raise ValueError(f"zone {zone!r} is not in region {self.region!r}")
        if len(set(self.zones)) != len(self.zones):
            raise ValueError(f"zones {self.zones} has duplicates")
        if self.runtime_version is not None and not _RUNTIME.match(self.runtime_version):
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
    ladder: CapacityLadder = Field(description="Rungs tried in order, e.g. reservation, spot, on-demand.")
    budget_usd: Usd = Field(description="Refuse to provision if the cost estimate exceeds this.")
    hours: float = Field(gt=0, le=24 * 90, description="Expected hours of use, for the estimate.")
    queue_timeout: Duration(timedelta(seconds=1), timedelta(days=7)) = Field(  # type: ignore[valid-type]
        timedelta(minutes=30), description="How long one queued request may wait (validUntilDuration)."
    )
    overall_timeout: Duration(timedelta(seconds=1), timedelta(days=14)) = Field(  # type: ignore[valid-type]
        timedelta(hours=2), description="How long the whole ladder may take."
    )
    quota_limit: str | None = Field(
        None, pattern=r"^[a-z][-a-z0-9_]{0,62}$", description="Prefect global concurrency limit held in chips."
    )

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
            if isinstance(rung, ReservationRung) and rung.zone not in self.slice.zones:
                raise ValueError(
                    f"reservation {rung.short_name!r} is in zone {rung.zone!r}, which is not one of the "
                    f"slice's zones {self.slice.zones}"
                )
        return self
