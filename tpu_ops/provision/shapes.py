"""Elastic shapes: the run's allocation at its target shape, else at the largest smaller shape there is.

``provision.slice.shapes`` (docs/elastic.md) lists the shapes a run may train on, the target first.
Every allocation (the first, and each recovery) walks the whole ladder at the target shape first; only
when that walk fails (every rung refused, or none came within its wait) is the next shape's walk
tried, and a ``shape`` ledger record says which shape the run got and why. So a run that fell back
goes back to the target at its next recovery whenever the target can be had again.

A shape is one slice type and a count (``2xv5p-16`` is a two-slice allocation); the chips of every
shape divide the target's (the spec checks), so the trainer keeps the global batch by accumulating
``target chips / chips`` micro-batches per step (the job contract's ``TPU_OPS_ACCUM_STEPS``).
``plan_shapes`` is what ``tpu-ops capacity plan`` shows of each shape: its expected $ per kept step.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from tpu_ops.accelerators import Shape
from tpu_ops.errors import ProvisioningError
from tpu_ops.provision import ledger as L
from tpu_ops.provision.allocation import Allocation
from tpu_ops.provision.prices import PriceTable
from tpu_ops.provision.records import Attempt
from tpu_ops.specs.slice import ProvisionSpec

SHAPE: Final = "shape"  # ledger record: the shape an allocation was obtained at (and what was tried before it)
SHAPE_UNAVAILABLE: Final = "shape-unavailable"  # ledger record: a shape's walk failed; the next one is tried


def shape_spec(spec: ProvisionSpec, shape: Shape) -> ProvisionSpec:
    """``spec`` asking for ``shape``: its accelerator type and slice count, every other field the same."""
    sl = spec.slice.model_copy(update={"accelerator_type": shape.accelerator.name, "slices": shape.count})
    return spec.model_copy(update={"slice": sl})


def accum_steps(target: Shape, shape: Shape) -> int:
    """Micro-batches per step on ``shape`` so a step is the target's (the spec made it divide)."""
    return target.chips // shape.chips


def shape_fields(target: Shape, shape: Shape) -> dict[str, Any]:
    """What the allocation document says of its shape (the agent's ``shape_env`` reads ``shape``, ``chips``)."""
    return {
        "shape": shape.name,
        "chips": shape.chips,
        "target_shape": target.name,
        "target_chips": target.chips,
        "accum_steps": accum_steps(target, shape),
    }


def live_shape(shapes: Sequence[Shape], live_types: Sequence[str]) -> Shape | None:
    """The shape of the run's live (running) slices, when they are exactly one of ``shapes``."""
    if not live_types or len(set(live_types)) != 1:
        return None
    return next((s for s in shapes if s.accelerator.name == live_types[0] and s.count == len(live_types)), None)


def gather_shapes(
    spec: ProvisionSpec,
    gather: Callable[..., Allocation],
    metadata: Callable[[int], Callable[[int], Mapping[str, str]]],
    ledger: L.Ledger,
    live: Callable[[], Sequence[str]] | None = None,
) -> tuple[Allocation, Shape]:
    """The allocation at the first shape of ``spec.slice.shape_list`` that can be had, and that shape.

    ``gather(metadata_fn, spec=...)`` obtains one allocation (``SliceLease.gather``); ``metadata(count)``
    is the launch metadata of a ``count``-slice allocation. ``live()``: the accelerator types of the
    run's running slices; a live allocation of a smaller shape (a supervisor taking the run over) is
    adopted as it is rather than torn down for the target. ``ProvisioningError`` (every shape's
    attempts) when no shape can be had.
    """
    shapes = spec.slice.shape_list
    target, failed, attempts = shapes[0], list[str](), list[Attempt]()
    adopt = live_shape(shapes, live()) if live is not None else None
    order = [adopt, *(s for s in shapes if s != adopt)] if adopt is not None else shapes
    for i, shape in enumerate(order):
        try:
            alloc = gather(metadata(shape.count), spec=shape_spec(spec, shape))
        except ProvisioningError as exc:
            attempts.extend(getattr(exc, "attempts", []) or [])
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            failed.append(f"{shape.name}: {first}")
            if i + 1 < len(order):
                ledger.append(SHAPE_UNAVAILABLE, shape=shape.name, next=order[i + 1].name, reason=first)
            continue
        why = "the target shape" if shape == target else f"the target {target.name} could not be had"
        if shape == adopt and shape != target:
            why = "the run's live allocation, adopted (the target is tried again at the next recovery)"
        ledger.append(SHAPE, **shape_fields(target, shape), why=why, unavailable=[f.split(":")[0] for f in failed])
        return alloc, shape
    lines = "\n  ".join(failed)
    raise ProvisioningError(f"no shape of {[s.name for s in shapes]} could be had:\n  {lines}", attempts)


def plan_shapes(
    spec: ProvisionSpec, table: PriceTable, histories: Callable[[ProvisionSpec], Any], steps_done: int = 0
) -> list[dict[str, Any]]:
    """Each shape's expected cost per kept step (``capacity plan``): its ladder ranked as the target's is,
    with a step taking ``accum_steps`` times the target's seconds (the same global batch on fewer chips,
    scaling linearly) at its own chips' price and its own capacity history (``histories(shape_spec)``)."""
    from tpu_ops.provision import ranking
    from tpu_ops.provision.steps import plan

    shapes = spec.slice.shape_list
    rows = []
    for shape in shapes:
        k = accum_steps(shapes[0], shape)
        sub = shape_spec(spec, shape).model_copy(update={"hours": spec.hours * k})
        run = ranking.run_model(sub, steps_done=steps_done)
        _, choice = ranking.order(sub, plan(sub), table, histories(sub), run)
        first = choice.ranked[0].expectation.to_json() if choice.ranked else {}
        rows.append(
            {
                "shape": shape.name,
                "chips": shape.chips,
                "accum_steps": k,
                "seconds_per_step": run.seconds_per_step,
                "first_rung": f"{first.get('tier', '-')} in {first.get('zone', '-')}",
                "usd_per_step": first.get("usd_per_step"),
                "wall_s": first.get("wall_s"),
            }
        )
    return rows
