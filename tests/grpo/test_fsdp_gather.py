"""When a sharded student base is gathered whole (grpo/fsdp.py): only for engines that read its own weights.

On a GPU the base is sharded because it does not fit one device: gathering it for an engine that holds weights
of its own (vLLM, or here a transformers engine over its own copy) would run out of memory for nothing.
"""

from __future__ import annotations

import pytest
import torch

from appliance.config.schema import StudentSpec
from appliance.engines.hf import HFEngine
from appliance.engines.merged_copy import MergedCopyEngine
from appliance.grpo.fsdp import generates_with, remerges_from, whole_weights
from appliance.grpo.student import Student

pytestmark = pytest.mark.model


def test_only_engines_that_read_the_students_weights_call_for_the_whole_base(tiny_model_dir):
    spec = StudentSpec.model_validate({"model": str(tiny_model_dir), "quantization": "none", "lora": {"rank": 4}})
    student = Student(spec, tiny_model_dir, "cpu")
    model = student.model
    shared = HFEngine(model, student.tokenizer, name="shared")  # rollouts (and a judge) on the trainer's weights
    merged = MergedCopyEngine(student, tiny_model_dir, name="merged")  # its own copy, re-merged from the base
    separate = HFEngine.load(tiny_model_dir, device="cpu")  # weights of its own, as vLLM's
    try:
        assert generates_with(shared, model) and not remerges_from(shared, model)
        assert remerges_from(merged, model) and not generates_with(merged, model)
        assert not generates_with(separate, model) and not remerges_from(separate, model)
        assert not generates_with(None, model) and not remerges_from(None, model)
    finally:
        for engine in (merged, separate):
            engine.close()


def test_an_unsharded_model_is_left_as_it_is(tiny_model_dir):
    spec = StudentSpec.model_validate({"model": str(tiny_model_dir), "quantization": "none", "lora": {"rank": 4}})
    model = Student(spec, tiny_model_dir, "cpu").model
    before = [p.detach().clone() for p in model.parameters()]
    with whole_weights(model):
        assert all(type(p) is torch.nn.Parameter for p in model.parameters())
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
