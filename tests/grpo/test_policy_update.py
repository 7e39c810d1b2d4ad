"""The update itself, on a tiny real model: training mode, importance weights, non-finite steps, pinned sampling."""

from __future__ import annotations

import math

import pytest
import torch
from tiny_model import make_tiny_model

from appliance.config.schema import GrpoSpec, StudentSpec
from appliance.engines.engine import Sampling
from appliance.engines.hf import HFEngine
from appliance.grpo.update import make_optimizer, make_scheduler
from appliance.grpo.student import Student, pack_batch
from appliance.grpo.update import GrpoUpdater, TrainSample

pytestmark = pytest.mark.model

PROMPT = [{"role": "user", "content": "What is 3 * 4?"}]


def _student(model_dir, dropout: float = 0.0, checkpointing: bool = False, seed: int = 0) -> Student:
    torch.manual_seed(seed)
    spec = StudentSpec.model_validate(
        {"model": str(model_dir), "quantization": "none", "lora": {"rank": 4, "alpha": 8, "dropout": dropout}}
    )
    student = Student(spec, model_dir, "cpu", gradient_checkpointing=checkpointing)
    with torch.no_grad():  # a non-zero B, so the adapter (and its dropout) changes the output
        for name, parameter in student.model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0.0, 0.5)
    return student


def _samples(student: Student, count: int = 4, tokens: int = 10, with_engine: bool = False) -> list[TrainSample]:
    engine = HFEngine(student.model, student.tokenizer, name="tiny")
    prompt = engine.render_chat(PROMPT)
    completions = engine.generate([prompt], Sampling(max_new_tokens=tokens, n=count, temperature=1.0, seed=3))[0]
    return [
        TrainSample(
            c.prompt_token_ids,
            c.token_ids,
            advantage=1.0 if i % 2 else -1.0,
            engine_logprobs=list(c.logprobs) if with_engine else None,
        )
        for i, c in enumerate(completions)
    ]


def _updater(student: Student, **grpo) -> GrpoUpdater:
    spec = GrpoSpec.model_validate({"learning_rate": 1e-2, **grpo})
    optimizer = make_optimizer(student.trainable_parameters(), spec, "cpu")
    return GrpoUpdater(student, optimizer, make_scheduler(optimizer, spec), spec, importance_sampling_cap=2.0)


def _batch(student, samples):
    return pack_batch([s.prompt_ids for s in samples], [s.completion_ids for s in samples], student.pad_id)


def test_dropout_changes_the_forward_in_training_mode_only(tiny_model_dir):
    student = _student(tiny_model_dir, dropout=0.5)
    batch = _batch(student, _samples(student))
    with torch.no_grad():
        eval_a, eval_b = (student.completion_logprobs(batch, 1.0) for _ in range(2))
        train_a, train_b = (student.completion_logprobs(batch, 1.0, train=True) for _ in range(2))
    assert torch.equal(eval_a, eval_b)
    assert not torch.allclose(train_a, train_b)
    assert not student.model.training  # back in eval mode for generation


def test_gradient_checkpointing_recomputes_each_layer_in_the_backward(tiny_model_dir):
    recomputed = {}
    for checkpointing in (False, True):
        student = _student(tiny_model_dir, checkpointing=checkpointing)
        batch = _batch(student, _samples(student))
        layer = student.model.get_base_model().model.layers[0]
        count = [0]
        # A pre-hook: torch stops a recomputation as soon as it has what the backward needs, before the end.
        handle = layer.register_forward_pre_hook(lambda *args: count.__setitem__(0, count[0] + 1))
        logprobs = student.completion_logprobs(batch, 1.0, train=True)
        forward = count[0]
        logprobs.sum().backward()
        handle.remove()
        recomputed[checkpointing] = count[0] - forward
    assert recomputed == {False: 0, True: 1}


def test_importance_weights_and_the_logged_gap_come_from_the_old_policy(tiny_model_dir):
    gaps = {}
    for iterations in (1, 4):
        student = _student(tiny_model_dir)
        samples = _samples(student, with_engine=True)
        # An engine that sampled from a slightly different policy: shift its logprobs by a known amount.
        for sample in samples:
            sample.engine_logprobs = [value - 0.05 for value in sample.engine_logprobs]
        updater = _updater(student, iterations=iterations, learning_rate=5e-2)
        with torch.no_grad():
            old = student.completion_logprobs(_batch(student, samples), 1.0)
        # Each micro-batch's weights, whether prepared before the update or taken in the gradient pass.
        taken = []
        importance = updater._importance
        updater._importance = lambda *args: taken.append(importance(*args)) or taken[-1]
        stats = updater.step(samples, 8)
        mask = _batch(student, samples).completion_mask.bool()
        expected = torch.clamp(torch.exp(old - (old - 0.05).detach()), max=2.0)  # engine = old - 0.05 here
        assert len(taken) == 1
        assert torch.allclose(taken[0][0][mask], expected[mask], atol=1e-3)
        assert updater.applied_steps == iterations and not stats.nonfinite
        gaps[iterations] = stats.logprob_diff_mean
    # The policy moves over 4 iterations, but the gap is measured once against the sampling policy.
    assert gaps[4] == pytest.approx(gaps[1], abs=1e-4)
    assert gaps[1] == pytest.approx(0.05, abs=5e-3)


def test_with_one_iteration_engine_logprobs_add_no_forward_pass(tiny_model_dir):
    """The importance weights of a single-iteration update come from its gradient pass (TRL runs another)."""
    forwards = {}
    for with_engine in (False, True):
        student = _student(tiny_model_dir)
        samples = _samples(student, with_engine=with_engine)
        layer = student.model.get_base_model().model.layers[0]
        count = [0]
        handle = layer.register_forward_pre_hook(lambda *args: count.__setitem__(0, count[0] + 1))
        stats = _updater(student, iterations=1).step(samples, 4)
        handle.remove()
        assert not stats.nonfinite
        forwards[with_engine] = count[0]
    assert forwards[True] == forwards[False] > 0


def test_a_nan_loss_skips_the_optimizer_step_and_leaves_the_adapter_unchanged(tiny_model_dir):
    student = _student(tiny_model_dir)
    samples = _samples(student)
    samples[0].advantage = math.nan
    before = [p.detach().clone() for p in student.trainable_parameters()]
    updater = _updater(student, iterations=2)
    stats = updater.step(samples, 8)
    assert stats.nonfinite and updater.applied_steps == 0
    assert all(torch.equal(a, b) for a, b in zip(before, student.trainable_parameters()))


def test_rollouts_sample_the_trainers_policy_despite_the_models_generation_config(demo_model_dir, tmp_path):
    # Qwen2.5-Instruct-style defaults: a repetition penalty and top-k in generation_config.json.
    model_dir = make_tiny_model(
        demo_model_dir,
        tmp_path / "tiny-penalised",
        generation={"repetition_penalty": 1.8, "top_k": 3, "do_sample": True},
    )
    student = _student(model_dir)
    samples = _samples(student, count=4, tokens=16, with_engine=True)
    with torch.no_grad():
        trainer_logp = student.completion_logprobs(_batch(student, samples), 1.0)
    for row, sample in enumerate(samples):
        engine = torch.tensor(sample.engine_logprobs)
        assert torch.allclose(engine, trainer_logp[row, : len(engine)], atol=1e-4), (row, engine, trainer_logp[row])
