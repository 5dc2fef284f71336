"""Elastic shapes in the job contract: the accumulation factor and the shapes come from the live allocation."""

from __future__ import annotations

from dataclasses import fields

import pytest

from tpu_ops.accelerators import parse_shape
from tpu_ops.agent.job import ContractError, Job, JobEnv, allocation_doc, job_env, shape_env
from tpu_ops.provision.shapes import shape_fields

JOB = Job("r", "gs://b/r", 10, 5, target_shape="v5p-32", target_chips=16)
BASE = {
    "TPU_OPS_RUN_ID": "r",
    "TPU_OPS_CHECKPOINT_DIR": "gs://b/r",
    "TPU_OPS_STEPS": "10",
    "TPU_OPS_CHECKPOINT_EVERY": "5",
}


def _doc(shape: str, hosts: int) -> dict[str, object]:
    """The allocation document the keeper writes for ``shape`` (one slice of ``hosts`` hosts)."""
    doc = allocation_doc("inc", [("qr", [f"10.0.0.{h}" for h in range(hosts)])])
    return {**doc, "kept": [], **shape_fields(parse_shape("v5p-32"), parse_shape(shape))}


@pytest.mark.parametrize(("shape", "hosts", "accum"), [("v5p-32", 4, "1"), ("v5p-16", 2, "2"), ("v5p-8", 1, "4")])
def test_the_accumulation_keeps_the_target_chips(shape: str, hosts: int, accum: str) -> None:
    env = shape_env(JOB, _doc(shape, hosts))
    assert env == {
        "TPU_OPS_ACCUM_STEPS": accum,
        "TPU_OPS_CHIPS": str(parse_shape(shape).chips),
        "TPU_OPS_TARGET_CHIPS": "16",
        "TPU_OPS_SHAPE": shape,
        "TPU_OPS_TARGET_SHAPE": "v5p-32",
    }
    read = job_env({**BASE, **env})
    assert (read.accum_steps, read.chips * read.accum_steps, read.target_chips) == (int(accum), 16, 16)
    assert (read.shape, read.target_shape) == (shape, "v5p-32")


def test_without_shapes_nothing_is_set_and_the_defaults_hold() -> None:
    assert shape_env(Job("r", "gs://b/r", 10, 5), _doc("v5p-16", 2)) == {}  # a run without shapes
    assert shape_env(JOB, allocation_doc("inc", [("qr", ["h"])])) == {}  # a document without a shape
    read = job_env(BASE)
    assert (read.accum_steps, read.chips, read.target_chips, read.shape, read.target_shape) == (1, 0, 0, "", "")
    # the names and defaults the Orbax example trainer's helper adds too (keep them in step)
    defaults = {f.name: f.default for f in fields(JobEnv)}
    assert {k: defaults[k] for k in ("accum_steps", "chips", "target_chips", "shape", "target_shape")} == {
        "accum_steps": 1,
        "chips": 0,
        "target_chips": 0,
        "shape": "",
        "target_shape": "",
    }


def test_a_shape_that_does_not_divide_the_target_is_refused() -> None:
    doc = {**allocation_doc("inc", [("qr", ["h"])]), "shape": "3xv5p-8", "chips": 12}
    with pytest.raises(ContractError, match="12 chips does not divide the target's 16"):
        shape_env(JOB, doc)
    with pytest.raises(ContractError, match="TPU_OPS_ACCUM_STEPS=0 is below 1"):
        job_env({**BASE, "TPU_OPS_ACCUM_STEPS": "0"})


def test_the_job_document_names_the_target_only_with_shapes() -> None:
    from tpu_ops.specs.slice import SliceSpec
    from tpu_ops.train.incarnations import elastic

    base = {"accelerator_type": "v5p-32", "region": "us-east5", "zones": ["us-east5-a"]}
    assert elastic(SliceSpec(**base)) == {}
    assert elastic(SliceSpec(**base, shapes=["v5p-32", "v5p-16"])) == {"target_shape": "v5p-32", "target_chips": 16}
    two = SliceSpec(**{**base, "accelerator_type": "v5p-16"}, slices=2, shapes=["2xv5p-16", "v5p-16"])
    assert elastic(two) == {"target_shape": "2xv5p-16", "target_chips": 16}
