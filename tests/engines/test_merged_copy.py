"""The merged rollout copy samples from exactly the policy the 4-bit + LoRA trainer holds."""

from __future__ import annotations

import pytest
import torch

from appliance.config.schema import LoraSpec, StudentSpec
from appliance.engines.engine import Sampling
from appliance.engines.merged_copy import DequantizedLinear, MergedCopyEngine, _without
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
    assert engine.samples_like_trainer  # the trainer takes no importance weights
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

    # The embeddings and the (tied) head are the student's tensors, not a second copy of them, and converting
    # the copy (as sleep() moves it to host RAM on CUDA) leaves the student's in place.
    base = student.model.get_base_model()
    embedding = base.get_input_embeddings().weight
    assert engine.model.get_input_embeddings().weight is embedding
    assert engine.model.get_output_embeddings().weight is embedding
    with _without(engine._shared):
        engine.model.to(torch.float64)
    assert embedding.dtype == torch.float32 and engine.model.get_input_embeddings().weight is embedding
    assert engine.model.model.layers[0].self_attn.q_proj.weight.dtype == torch.float64
    assert base.model.layers[0].mlp.down_proj.weight.dtype == torch.float32


def _lora_gradients(student: Student, batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    logp = student.completion_logprobs(batch, temperature=1.0, train=True)
    (logp * batch.completion_mask).sum().backward()
    grads = {n: p.grad.clone() for n, p in student.model.named_parameters() if p.requires_grad}
    student.model.zero_grad(set_to_none=True)
    return logp.detach(), grads


def test_the_student_trains_through_the_copys_dequantized_mlp_with_the_same_result(demo_model_dir):
    """The linear layers LoRA does not wrap are the copy's dequantized tensors in the student: no 4-bit form is
    kept, and logprobs and LoRA gradients equal those of a student that dequantizes its 4-bit layers itself."""
    spec = StudentSpec(model="demo", quantization="nf4", lora=LoraSpec(rank=8, alpha=16))
    plain, sharing = Student(spec, demo_model_dir, "cpu"), Student(spec, demo_model_dir, "cpu")
    _perturb_adapter(plain, seed=3)
    adapter = {n: p for n, p in plain.model.named_parameters() if p.requires_grad}
    for name, parameter in sharing.model.named_parameters():
        if parameter.requires_grad:
            parameter.data = adapter[name].data.clone()  # lora_A is drawn at random when a student is made
    engine = MergedCopyEngine(sharing, demo_model_dir, name="copy")

    layers, copied = sharing.model.get_base_model().model.layers, engine.model.model.layers
    for index in (0, len(layers) - 1):
        for name in ("gate_proj", "up_proj", "down_proj"):
            mlp = getattr(layers[index].mlp, name)
            assert isinstance(mlp, DequantizedLinear) and mlp.weight is getattr(copied[index].mlp, name).weight
    assert not any(getattr(p, "quant_state", None) is not None for p in layers[0].mlp.parameters())
    assert getattr(layers[0].self_attn.q_proj.base_layer.weight, "quant_state", None) is not None  # LoRA's own

    generator = torch.Generator().manual_seed(0)
    prompts = torch.randint(100, 40000, (3, 12), generator=generator).tolist()
    completions = torch.randint(100, 40000, (3, 9), generator=generator).tolist()
    batch = pack_batch(prompts, completions, plain.pad_id)
    (logp_plain, grads_plain), (logp_sharing, grads_sharing) = (_lora_gradients(s, batch) for s in (plain, sharing))
    assert float((logp_plain - logp_sharing).abs().max()) < 1e-5
    assert grads_plain.keys() == grads_sharing.keys() and len(grads_plain) == 4 * 30 * 2
    for name, grad in grads_plain.items():
        assert float(grad.abs().max()) > 0
        assert torch.allclose(grad, grads_sharing[name], rtol=1e-4, atol=1e-6), name


def test_a_bf16_copy_of_an_fp32_student_samples_its_rounded_policy_and_shares_nothing(demo_model_dir):
    """engine.rollout_dtype bfloat16: the copy is the merged policy rounded to bf16, the student keeps all of its
    own fp32 and 4-bit tensors, and the engine says it samples apart from the trainer (importance sampling)."""
    student = Student(
        StudentSpec(model="demo", quantization="nf4", lora=LoraSpec(rank=8, alpha=16)), demo_model_dir, "cpu"
    )
    _perturb_adapter(student, seed=4)
    engine = MergedCopyEngine(student, demo_model_dir, name="copy", dtype=torch.bfloat16)
    assert not engine.samples_like_trainer
    assert {p.dtype for p in engine.model.parameters()} == {torch.bfloat16}
    base = student.model.get_base_model()
    assert engine.model.get_input_embeddings().weight is not base.get_input_embeddings().weight
    assert base.get_input_embeddings().weight.dtype == torch.float32
    assert not any(isinstance(m, DequantizedLinear) for m in base.modules())
    assert getattr(base.model.layers[0].mlp.down_proj.weight, "quant_state", None) is not None

    # Each target is dequant(W4) + B @ A of the student, rounded once to bf16.
    layer = base.model.layers[3].self_attn.q_proj
    import bitsandbytes.functional as bnb_functional

    weight = layer.get_base_layer().weight
    merged = bnb_functional.dequantize_4bit(weight.data, weight.quant_state).float()
    merged += layer.get_delta_weight("default").float()
    assert torch.equal(engine.model.model.layers[3].self_attn.q_proj.weight, merged.to(torch.bfloat16))

    # The head gets contiguous input: transformers' strided last-position view made torch expand the frozen
    # bf16 head per row (2.7 s and 3.4 GB at 64 rows; merged_copy._contiguous_input).
    contiguous = []
    engine.model.get_output_embeddings().register_forward_hook(
        lambda module, args, output: contiguous.append(args[0].is_contiguous())
    )
    questions = [engine.render_chat([{"role": "user", "content": q}]) for q in ("Name a colour.", "What is 2 + 3?")]
    engine.generate(questions, Sampling(max_new_tokens=2, n=1, temperature=0.0))
    assert len(contiguous) >= 2 and all(contiguous)
    prompt = engine.render_chat([{"role": "user", "content": "What is 7 * 8?"}])
    completions = engine.generate([prompt], Sampling(max_new_tokens=10, n=3, temperature=1.0, seed=5))[0]
    engine_logp = torch.tensor([lp for c in completions for lp in c.logprobs])
    gap = (engine_logp - _trainer_logprobs(student, completions)).abs()
    # bf16 rounding moves the logprobs (the fp32 copy stays within 2e-3, test above) but not far.
    assert 2e-3 < float(gap.max()) < 0.5
