"""The elastic-shape fields of the job contract as a trainer reads them (``job_env``)."""

from __future__ import annotations

import pytest

from tpu_ops.agent.job import ContractError, job_env

BASE = {"TPU_OPS_RUN_ID": "r", "TPU_OPS_CHECKPOINT_DIR": "gs://b/r", "TPU_OPS_STEPS": "10",
        "TPU_OPS_CHECKPOINT_EVERY": "5"}  # fmt: skip


def test_an_agent_that_says_nothing_of_shapes_means_the_target_shape() -> None:
    read = job_env(BASE)
    assert (read.accum_steps, read.chips, read.target_chips, read.shape, read.target_shape) == (1, 0, 0, "", "")


def test_a_smaller_shape_reads_its_accumulation_and_both_shapes() -> None:
    read = job_env({**BASE, "TPU_OPS_ACCUM_STEPS": "2", "TPU_OPS_CHIPS": "8", "TPU_OPS_TARGET_CHIPS": "16",
                    "TPU_OPS_SHAPE": "v5p-16", "TPU_OPS_TARGET_SHAPE": "v5p-32"})  # fmt: skip
    assert (read.accum_steps, read.chips, read.target_chips) == (2, 8, 16)
    assert (read.shape, read.target_shape) == ("v5p-16", "v5p-32")


@pytest.mark.parametrize(("value", "says"), [("0", "below 1"), ("two", "not an integer")])
def test_a_bad_accumulation_is_refused_naming_the_variable(value: str, says: str) -> None:
    with pytest.raises(ContractError, match=f"TPU_OPS_ACCUM_STEPS.*{says}"):
        job_env({**BASE, "TPU_OPS_ACCUM_STEPS": value})
