"""Chunked sampled-token logprobs equal the plain full-logits computation, values and gradients."""

from __future__ import annotations

import copy
from contextlib import nullcontext

import pytest
import torch

from appliance.config.schema import StudentSpec
from appliance.grpo.loss import LOSS_TYPES, StepNormalizer, policy_loss
from appliance.grpo.student import Student, TokenBatch, plain_head
from appliance.budget.components import logit_chunk_tokens
from appliance.grpo.student import _chunk_logits, chunked_token_logprobs


def _textbook(hidden, head, targets, temperature):
    """log_softmax over the whole vocabulary, then the sampled column: what the chunks must equal."""
    logits = head(hidden)
    logits = logits.float() if logits.dtype != torch.float64 else logits
    return torch.log_softmax(logits / temperature, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)


@pytest.mark.parametrize("bias", [False, True])
def test_chunks_equal_the_full_log_softmax_in_values_and_gradients(bias):
    torch.manual_seed(0)
    head = torch.nn.Linear(16, 50, bias=bias, dtype=torch.float64)
    hidden = torch.randn(3, 7, 16, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 50, (3, 7))
    upstream = torch.randn(3, 7, dtype=torch.float64)
    # 50 x 4 bytes per token: 5 tokens per chunk, so 21 tokens make 5 chunks, the last one short.
    assert logit_chunk_tokens(50, 5 * 50 * 4) == 5
    results = []
    for compute in (
        lambda: _textbook(hidden, head, targets, 0.7),
        lambda: chunked_token_logprobs(hidden, head, targets, 0.7, chunk_bytes=1000),
    ):
        hidden.grad = None
        head.zero_grad()
        values = compute()
        (values.double() * upstream).sum().backward()
        grads = [hidden.grad.clone(), head.weight.grad.clone()] + ([head.bias.grad.clone()] if bias else [])
        results.append((values.detach().double(), grads))
    (plain, plain_grads), (chunked, chunked_grads) = results
    torch.testing.assert_close(chunked, plain, rtol=1e-6, atol=1e-6)
    for got, want in zip(chunked_grads, plain_grads):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_a_frozen_head_gets_no_gradient_and_the_chunk_is_never_the_whole_vocabulary():
    head = torch.nn.Linear(8, 1000).requires_grad_(False)
    hidden = torch.randn(2, 64, 8, requires_grad=True)
    seen = []
    original = _chunk_logits
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(
            "appliance.grpo.student._chunk_logits", lambda *args: seen.append(original(*args).shape) or original(*args)
        )
        chunked_token_logprobs(
            hidden, head, torch.randint(0, 1000, (2, 64)), chunk_bytes=16 * 1000 * 4
        ).sum().backward()
    # 128 tokens in chunks of 16, forward and again in backward; never all 128 rows at once.
    assert seen == [(16, 1000)] * 16
    assert hidden.grad is not None and head.weight.grad is None


def test_on_the_cpu_the_default_chunk_is_the_one_the_planner_counts(monkeypatch):
    # 65,536 x 4 bytes of logits per token: a 32 MiB CPU chunk (budget/components.py) holds 128 tokens.
    head = torch.nn.Linear(8, 65536, bias=False).requires_grad_(False)
    hidden = torch.randn(1, 300, 8, requires_grad=True)
    seen = []
    original = _chunk_logits
    monkeypatch.setattr(
        "appliance.grpo.student._chunk_logits", lambda *args: seen.append(original(*args).shape[0]) or original(*args)
    )
    chunked_token_logprobs(hidden, head, torch.randint(0, 65536, (1, 300))).sum().backward()
    assert seen == [128, 128, 44] * 2  # forward, then backward


@pytest.fixture(scope="module")
def student(demo_model_dir) -> Student:
    """The bundled model as the trainer loads it: nf4, fp32 compute, LoRA."""
    torch.manual_seed(0)
    spec = StudentSpec.model_validate(
        {
            "model": str(demo_model_dir),
            "quantization": "nf4",
            "compute_dtype": "float32",
            "lora": {"rank": 8, "alpha": 16, "dropout": 0.0},
        }
    )
    student = Student(spec, demo_model_dir, "cpu")
    with torch.no_grad():  # a non-zero B: the adapter moves the logits, and the reference differs
        for name, parameter in student.model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0.0, 0.05)
    assert plain_head(student.model.get_base_model()) is not None  # the bundled model takes the chunked path
    return student


def _plain_logprobs(student: Student, batch: TokenBatch, temperature: float, reference: bool = False) -> torch.Tensor:
    """The pre-chunking path: the model's own logits over the completion, then the textbook log-softmax."""
    width = batch.completion_ids.shape[1]
    context = student.model.disable_adapter() if reference else nullcontext()
    with context:
        logits = student.model(
            input_ids=batch.input_ids,
            attention_mask=batch.attention_mask,
            position_ids=(batch.attention_mask.cumsum(-1) - 1).clamp(min=0),
            logits_to_keep=width + 1,
            use_cache=False,
        ).logits[:, :-1]
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    return logp.gather(-1, batch.completion_ids.unsqueeze(-1)).squeeze(-1)


def _batch() -> TokenBatch:
    torch.manual_seed(1)
    prompt, completion = torch.randint(100, 20000, (4, 12)), torch.randint(100, 20000, (4, 9))
    mask = torch.ones(4, 9, dtype=torch.long)
    mask[1, 6:], mask[3, 2:] = 0, 0  # completions of 9, 6, 9 and 2 tokens
    attention = torch.ones(4, 21, dtype=torch.long)
    attention[2, :5] = 0  # a left-padded prompt
    return TokenBatch(torch.cat([prompt, completion], 1), attention, completion, mask)


@pytest.mark.model
def test_every_aggregation_gets_the_loss_and_head_input_gradients_of_the_full_logits(student, monkeypatch):
    """Below the LM head both paths share one autograd graph: the head's input is where they could part.

    The head runs in float64 here (the model's own weights and hidden states), so that the check sees the
    algorithm: in fp32 both paths are about 2e-5 from the float64 logprobs, each by its own summation order.
    """
    batch = _batch()
    monkeypatch.setattr("appliance.grpo.student.CHUNK_LOGIT_BYTES", 7 * student.model.config.vocab_size * 4)
    causal_lm = student.model.get_base_model()
    head = copy.deepcopy(causal_lm.get_output_embeddings()).double()
    with torch.no_grad():
        old, reference = _plain_logprobs(student, batch, 0.8), _plain_logprobs(student, batch, 0.8, reference=True)
        position_ids = (batch.attention_mask.cumsum(-1) - 1).clamp(min=0)
        hidden = causal_lm.get_decoder()(
            input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=position_ids
        ).last_hidden_state[:, -10:-1]
    hidden = hidden.double().requires_grad_(True)
    for loss_type in LOSS_TYPES:
        losses, grads = [], []
        for logprobs in (_textbook, chunked_token_logprobs):
            hidden.grad = None
            loss = _loss(logprobs(hidden, head, batch.completion_ids, 0.8), old, reference, batch, loss_type)
            loss.backward()
            losses.append(loss.detach())
            grads.append(hidden.grad.clone())
        torch.testing.assert_close(losses[1], losses[0], rtol=1e-5, atol=1e-5)
        assert float(grads[0].abs().max()) > 1e-3
        torch.testing.assert_close(grads[1], grads[0], rtol=1e-5, atol=1e-5)


def _loss(logprobs, old, reference, batch: TokenBatch, loss_type: str):
    mask = batch.completion_mask.float()
    rows = mask.shape[0]
    normalizer = StepNormalizer(sequences=rows, tokens=int(mask.sum()), micro_batches=1, max_new_tokens=9)
    advantages = torch.tensor([1.0, -0.5, 0.25, -1.0, 0.5, -0.75][:rows], dtype=logprobs.dtype)
    # beta > 0: the reference logprobs are in the loss; old shifted by 0.1 so that the ratios are not all 1
    old, reference = old.to(logprobs.dtype), reference.to(logprobs.dtype)
    return policy_loss(logprobs, old - 0.1, advantages, mask, loss_type, normalizer, 0.2, 0.28, 0.04, reference).loss


def _lora_grads(student: Student, logprobs, old, reference, batch: TokenBatch) -> torch.Tensor:
    student.model.zero_grad(set_to_none=True)
    _loss(logprobs(), old, reference, batch, "grpo").backward()
    return torch.cat([p.grad.flatten() for p in student.trainable_parameters()])


@pytest.mark.model
def test_old_reference_and_current_logprobs_of_the_student_match_the_full_logits(student, monkeypatch):
    batch = _batch()
    monkeypatch.setattr("appliance.grpo.student.CHUNK_LOGIT_BYTES", 7 * student.model.config.vocab_size * 4)
    with torch.no_grad():
        old, reference = _plain_logprobs(student, batch, 0.8), _plain_logprobs(student, batch, 0.8, reference=True)
        assert float((old - reference).abs().max()) > 1e-2  # the adapter matters, so the two are told apart
        torch.testing.assert_close(student.completion_logprobs(batch, 0.8), old, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(
            student.completion_logprobs(batch, 0.8, reference=True), reference, rtol=1e-5, atol=1e-5
        )
    plain = _lora_grads(student, lambda: _plain_logprobs(student, batch, 0.8), old, reference, batch)
    chunked = _lora_grads(student, lambda: student.completion_logprobs(batch, 0.8, train=True), old, reference, batch)
    # Through 30 fp32 layers the head's rounding (both paths are ~2e-5 from the float64 logprobs) grows to a
    # relative 2e-4 of the LoRA gradient (measured); a wrong gradient would be off by order 1.
    assert float((chunked - plain).norm() / plain.norm()) < 1e-3


def _grouped_batch() -> TokenBatch:
    """Two prompts of 12 and 9 tokens (left-padded), three completions each, of 9, 6, 9, 2, 9 and 4 tokens."""
    torch.manual_seed(2)
    prompts = torch.randint(100, 20000, (2, 12)).repeat_interleave(3, 0)
    completion = torch.randint(100, 20000, (6, 9))
    mask = torch.ones(6, 9, dtype=torch.long)
    mask[1, 6:], mask[3, 2:], mask[5, 4:] = 0, 0, 0
    attention = torch.cat([torch.ones(6, 12, dtype=torch.long), mask], 1)
    attention[3:, :3] = 0  # the second prompt is 9 tokens, left-padded
    return TokenBatch(torch.cat([prompts, completion], 1), attention, completion, mask)


# Decoder calls of the grouped batch: packed, each prompt and its 3 completions as one sequence of 12 + 3 x 9
# tokens; in two passes, the 2 prompts once (12 columns), then the 6 completions (9 columns).
CALLS = {"packed": [(2, 39)], "two passes": [(2, 12), (6, 9)]}


@pytest.mark.model
@pytest.mark.parametrize("layout", sorted(CALLS))
def test_a_group_shares_one_prompt_pass_with_the_values_and_gradients_of_whole_sequences(student, monkeypatch, layout):
    """The update runs each distinct prompt once, packed with its completions or before them, the completions
    on its keys and values (grpo/student.py): the same logprobs (old, reference, current) and LoRA gradients as
    the whole sequences."""
    from appliance.budget import components

    if layout == "two passes":
        monkeypatch.setattr(components, "PACKED_SEQUENCE_TOKENS", 38)
    batch = _grouped_batch()
    monkeypatch.setattr("appliance.grpo.student.CHUNK_LOGIT_BYTES", 7 * student.model.config.vocab_size * 4)
    rows_seen = []
    layer = student.model.get_base_model().model.layers[0]
    handle = layer.register_forward_pre_hook(
        lambda module, args, kwargs: rows_seen.append(tuple((args[0] if args else kwargs["hidden_states"]).shape[:2])),
        with_kwargs=True,
    )
    try:
        with torch.no_grad():
            old, reference = _plain_logprobs(student, batch, 0.8), _plain_logprobs(student, batch, 0.8, reference=True)
            rows_seen.clear()
            torch.testing.assert_close(student.completion_logprobs(batch, 0.8), old, rtol=1e-5, atol=1e-5)
            assert rows_seen == CALLS[layout]  # the model boundary
            torch.testing.assert_close(
                student.completion_logprobs(batch, 0.8, reference=True), reference, rtol=1e-5, atol=1e-5
            )
        plain = _lora_grads(student, lambda: _plain_logprobs(student, batch, 0.8), old, reference, batch)
        rows_seen.clear()
        shared = _lora_grads(
            student, lambda: student.completion_logprobs(batch, 0.8, train=True), old, reference, batch
        )
        assert rows_seen == CALLS[layout]
    finally:
        handle.remove()
    # As in the test above: fp32 rounding through 30 layers; a prompt gradient summed wrongly is off by order 1.
    assert float(plain.norm()) > 0
    assert float((shared - plain).norm() / plain.norm()) < 1e-3
