"""The merged rollout copy samples from exactly the policy the 4-bit + LoRA trainer holds."""

from __future__ import annotations

import pytest
import torch

from appliance.config.schema import LoraSpec, StudentSpec
from appliance.engines.base import Sampling
from appliance.engines.merged_copy import MergedCopyEngine
from appliance.grpo.student import Student, pack_batch

pytestmark = pytest.mark.model


def _perturb_adapter(student: Student, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    for name, parameter in student.model.named_parameters():
        if "lora_B" in name:
            parameter.data = torch.randn(parameter.shape, generator=generator) * 0.02


def _trainer_logprobs(student: Student, completions) -> torch.Tensor:
    batch = pack_batch([c.prompt_token_ids for c in completions], [c.token_ids for c in completions], student.pad_id)
    with torch.no_grad():
        logp = student.completion_logprobs(batch, temperature=1.0)
    return logp[batch.completion_mask.bool()]


def test_merged_copy_tracks_the_student_adapter(demo_model_dir):
    student = Student(
        StudentSpec(model="demo", quantization="nf4", lora=LoraSpec(rank=8, alpha=16)), demo_model_dir, "cpu"
    )
    _perturb_adapter(student, seed=1)
    engine = MergedCopyEngine(student, demo_model_dir, name="copy")
    prompt = engine.render_chat([{"role": "user", "content": "What is 7 * 8?"}])
    sampling = Sampling(max_new_tokens=10, n=3, temperature=1.0, seed=5)

    first = engine.generate([prompt], sampling)[0]
    engine_logp = torch.tensor([lp for c in first for lp in c.logprobs])
    difference = (engine_logp - _trainer_logprobs(student, first)).abs()
    assert float(difference.max()) < 2e-3

    _perturb_adapter(student, seed=2)
    engine.update_adapter(None, version=1)
    second = engine.generate([prompt], sampling)[0]
    assert engine.adapter_version == 1
    assert [c.token_ids for c in second] != [c.token_ids for c in first]  # the new adapter changed the policy
    engine_logp = torch.tensor([lp for c in second for lp in c.logprobs])
    assert float((engine_logp - _trainer_logprobs(student, second)).abs().max()) < 2e-3
