"""The SwiGLU MLP that keeps gate and up only: the same values and gradients as plain autograd, less saved."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from appliance.budget import components
from appliance.budget.shapes import fixture_for, load_config, shape_from_config
from appliance.config.schema import StudentSpec
from appliance.grpo.student import Student, TokenBatch
from appliance.grpo.student import _lean_forward, is_silu_gated_mlp, keep_gate_and_up_only, silu_gate


def _saved_bytes(compute) -> int:
    """Bytes of the distinct storages autograd saves while `compute` runs."""
    saved = {}

    def pack(tensor):
        saved[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        compute()
    return sum(saved.values())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_values_and_gradients_are_plain_autograd_s_bit_for_bit(dtype):
    torch.manual_seed(0)
    gate = (3 * torch.randn(37, 96)).to(dtype).requires_grad_()
    up = torch.randn(37, 96).to(dtype).requires_grad_()
    upstream = torch.randn(37, 96).to(dtype)
    results = []
    for compute in (lambda: F.silu(gate) * up, lambda: silu_gate(gate, up)):
        gate.grad = up.grad = None
        out = compute()
        out.backward(upstream)
        results.append((out.detach(), gate.grad.clone(), up.grad.clone()))
    for plain, lean in zip(*results):
        assert torch.equal(plain, lean)


def test_it_saves_two_of_the_three_intermediates():
    gate = torch.randn(64, 256, requires_grad=True)
    up = torch.randn(64, 256, requires_grad=True)
    one = 64 * 256 * 4
    assert _saved_bytes(lambda: F.silu(gate) * up) == 3 * one
    assert _saved_bytes(lambda: silu_gate(gate, up)) == 2 * one
    with torch.no_grad():  # generation: no autograd Function at all
        assert not silu_gate(gate, up).requires_grad


def test_only_silu_gated_mlps_change_and_the_planner_follows_the_config():
    class Mlp(torch.nn.Module):
        def __init__(self, act):
            super().__init__()
            self.gate_proj, self.up_proj = torch.nn.Linear(8, 16), torch.nn.Linear(8, 16)
            self.down_proj, self.act_fn = torch.nn.Linear(16, 8), act

    model = torch.nn.ModuleList([Mlp(torch.nn.SiLU()), Mlp(torch.nn.GELU(approximate="tanh"))])
    assert keep_gate_and_up_only(model) == 1
    assert model[0].forward.__func__ is _lean_forward and "forward" not in vars(model[1])
    llama = shape_from_config(load_config(fixture_for("Llama-3.1-8B")))
    gemma = shape_from_config(load_config(fixture_for("Gemma-2-9B")))
    assert llama.silu_gate and not gemma.silu_gate
    # Gemma's GELU MLP keeps its activated gate too: one more [tokens x intermediate] tensor per token.
    gemma_silu = shape_from_config(dict(load_config(fixture_for("Gemma-2-9B")), hidden_activation="silu"))
    extra = components._saved_per_token_per_layer(gemma, ["q_proj"], 2) - components._saved_per_token_per_layer(
        gemma_silu, ["q_proj"], 2
    )
    assert extra == gemma.intermediate * 2


@pytest.mark.model
def test_the_student_trains_as_before_with_less_kept(demo_model_dir):
    """Every MLP of the bundled student takes the lean path; its logprobs and LoRA gradients are unchanged."""
    torch.manual_seed(0)
    spec = StudentSpec.model_validate(
        {"model": str(demo_model_dir), "quantization": "nf4", "compute_dtype": "float32", "lora": {"rank": 8}}
    )
    student = Student(spec, demo_model_dir, "cpu")
    mlps = [m for m in student.model.modules() if is_silu_gated_mlp(m)]
    assert len(mlps) == student.model.config.num_hidden_layers
    assert all(m.forward.__func__ is _lean_forward for m in mlps)
    with torch.no_grad():
        for name, parameter in student.model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0.0, 0.05)
    ids = torch.randint(100, 20000, (3, 20))
    batch = TokenBatch(ids, torch.ones_like(ids), ids[:, 12:], torch.ones_like(ids[:, 12:]))

    def run():
        student.model.zero_grad(set_to_none=True)
        logprobs = student.completion_logprobs(batch, 1.0, train=True)
        logprobs.sum().backward()
        return logprobs.detach(), [p.grad.clone() for p in student.trainable_parameters()]

    lean_saved = _saved_bytes(run)
    lean = run()
    for mlp in mlps:
        del mlp.forward  # the class's own forward again
    plain_saved = _saved_bytes(run)
    plain = run()
    assert torch.equal(lean[0], plain[0])
    for got, want in zip(lean[1], plain[1]):
        assert torch.equal(got, want)
    # One [tokens x intermediate] fp32 tensor less per layer: 60 tokens x 1536 x 4 bytes x 30 layers.
    assert plain_saved - lean_saved == 60 * student.model.config.intermediate_size * 4 * len(mlps)
