"""Truncation-aware trajectories: cut turns are not malformed calls, rewards see `truncated`, the mask option works.

Plus the off-policy correction of external rollouts on the transformers engine: a group served by an older
adapter gets truncated importance weights from the served logprobs.
"""

from __future__ import annotations

import asyncio

import pytest
import torch

from appliance.agents.engine_client import EngineChatClient
from appliance.agents.envs.calculator import CalculatorEnvironment
from appliance.agents.trajectory import AssistantMessage, Sampled, SystemMessage, Trajectory, TrajectoryGroup
from appliance.agents.trajectory import UserMessage
from appliance.engines.engine import Sampling
from appliance.grpo.trajectories import EnvironmentReward, score_trajectories
from appliance.rewards.registry import RewardSample, WeightedReward


class Seen:
    """A reward that scores each sample by its index and keeps what it was given."""

    name = "seen"

    def __init__(self):
        self.samples: list[RewardSample] = []

    def __call__(self, samples: list[RewardSample]) -> list[float]:
        self.samples.extend(samples)
        return [float(index) for index in range(len(samples))]


def _turn(tokenizer, text: str, finish_reason: str) -> AssistantMessage:
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if finish_reason == "stop":
        ids.append(tokenizer.eos_token_id)
    sampled = Sampled(token_ids=ids, logprobs=[-0.5] * len(ids), finish_reason=finish_reason)
    return AssistantMessage(content=text, sampled=sampled)


def _two_turns(tokenizer, second_reason: str) -> Trajectory:
    messages = [
        SystemMessage(content="Answer."),
        UserMessage(content="What is 3 * 4?"),
        _turn(tokenizer, "Let me think about it.", "stop"),
        UserMessage(content="And?"),
        _turn(tokenizer, "It is twelve and the reason is", second_reason),
    ]
    return Trajectory(scenario_id="s", messages=messages, context_messages=1)


def _score(tokenizer, mode: str, max_tokens: int | None = None):
    seen = Seen()
    group = TrajectoryGroup(
        scenario_id="s", trajectories=[_two_turns(tokenizer, "length"), _two_turns(tokenizer, "stop")]
    )
    scored = score_trajectories(
        "external", [group], tokenizer, [WeightedReward("seen", 1.0, seen)], False, max_tokens, mode
    )
    return scored, seen


def test_rewards_see_truncated_and_the_record_says_so(tokenizer):
    scored, seen = _score(tokenizer, "off")
    assert [s.metadata["truncated"] for s in seen.samples] == [True, False]
    assert [s.metadata["finish_reasons"] for s in seen.samples] == [["stop", "length"], ["stop", "stop"]]
    records = scored.sample_records(1, tokenizer, 2)
    assert records[0]["length_cut"] and "length_cut" not in records[1]
    assert records[0]["finish_reasons"] == ["stop", "length"]


@pytest.mark.parametrize("mode", ["off", "turn", "trajectory"])
def test_a_truncated_trajectory_is_masked_per_the_option(tokenizer, mode):
    scored, _ = _score(tokenizer, mode)
    cut, whole = (item.tokens for item in scored.tokens)
    length = len(tokenizer("It is twelve and the reason is", add_special_tokens=False)["input_ids"])
    first = len(tokenizer("Let me think about it.", add_special_tokens=False)["input_ids"]) + 1  # + eos
    assert whole.trained_tokens == first + length + 1  # the untruncated one is never touched
    expected = {"off": first + length, "turn": first, "trajectory": 0}[mode]
    assert cut.trained_tokens == expected
    if mode == "turn":  # the turn that stopped still trains, with its own tokens
        trained = [i for i, m in zip(cut.input_ids, cut.assistant_mask) if m]
        assert tokenizer.decode(trained[:-1]) == "Let me think about it."


def test_a_trajectory_cut_to_the_bound_is_truncated_and_its_transcript_is_what_is_trained(tokenizer):
    whole, _ = _score(tokenizer, "off")
    bound = min(len(item.tokens.input_ids) for item in whole.tokens) - 4  # inside the second assistant turn
    scored, seen = _score(tokenizer, "turn", max_tokens=bound)
    assert all(item.truncated for item in scored.tokens)
    assert [s.metadata["truncated"] for s in seen.samples] == [True, True]
    assert all(s.metadata["cut_to_bound"] for s in seen.samples)
    kept = scored.tokens[1].tokens
    start = scored.tokens[1].first_trained
    assert seen.samples[1].completion.startswith(tokenizer.decode(kept.input_ids[start:], skip_special_tokens=True))
    assert "[cut here" in seen.samples[1].completion
    assert "the reason is" not in seen.samples[1].completion  # the cut part is neither trained nor judged
    # the cut fell inside the last turn: under "turn" it is masked, the turn before it still trains
    assert all(item.cut_turn for item in scored.tokens)
    first = len(tokenizer("Let me think about it.", add_special_tokens=False)["input_ids"]) + 1
    assert [item.tokens.trained_tokens for item in scored.tokens] == [first, first]


@pytest.mark.model
def test_a_turn_cut_at_max_new_tokens_is_not_a_malformed_call(tiny_engine):
    environment = CalculatorEnvironment(operand_min=11, operand_max=30, held_out=5)
    # two tokens: the random model never finishes a turn (or a call) in that
    client = EngineChatClient(tiny_engine, Sampling(max_new_tokens=2, temperature=1.0, seed=0))
    scenario = environment.scenarios("train", 1, seed=0)[0]
    trajectory = asyncio.run(environment.rollout(client, scenario))
    assert trajectory.assistant_turns()[-1].sampled.finish_reason == "length"
    assert trajectory.metrics["cut_turns"] == 1.0
    assert trajectory.metrics["malformed_calls"] == 0.0 and len(trajectory.assistant_turns()) == 1
    seen = Seen()
    group = TrajectoryGroup(scenario_id=scenario.id, trajectories=[trajectory, trajectory.model_copy(deep=True)])
    rewards = [WeightedReward("environment", 1.0, EnvironmentReward()), WeightedReward("seen", 1.0, seen)]
    scored = score_trajectories(
        "builtin:calculator", [group], tiny_engine.tokenizer, rewards, False, None, "trajectory"
    )
    assert all(sample.metadata["truncated"] for sample in seen.samples)
    assert all(item.tokens.trained_tokens == 0 for item in scored.tokens)


@pytest.mark.model
def test_an_off_policy_group_gets_importance_weights_from_the_served_logprobs(tiny_model_dir):
    from appliance.config.schema import GrpoSpec, StudentSpec
    from appliance.engines.hf import HFEngine
    from appliance.grpo.update import make_optimizer, make_scheduler
    from appliance.grpo.student import Student
    from appliance.grpo.update import GrpoUpdater

    torch.manual_seed(0)
    spec = StudentSpec.model_validate(
        {"model": str(tiny_model_dir), "quantization": "none", "lora": {"rank": 4, "alpha": 8, "dropout": 0.0}}
    )
    student = Student(spec, tiny_model_dir, "cpu")
    engine = HFEngine(student.model, student.tokenizer, name="tiny")
    prompt_messages = [SystemMessage(content="Answer."), UserMessage(content="What is 3 * 4?")]
    prompt = engine.render_chat([{"role": m.role, "content": m.content} for m in prompt_messages])
    served = engine.generate([prompt], Sampling(max_new_tokens=6, n=4, temperature=1.0, seed=1))[0]

    def trajectory(completion, served_step: int, reward: float) -> Trajectory:
        turn = AssistantMessage(
            content=completion.text,
            sampled=Sampled(
                token_ids=completion.token_ids,
                logprobs=completion.logprobs,
                prompt_token_ids=completion.prompt_token_ids,
                finish_reason=completion.finish_reason,
            ),
        )
        return Trajectory(
            scenario_id="s", messages=[*prompt_messages, turn], reward=reward, metadata={"served_step": served_step}
        )

    # served at step 1 (two of them) and at step 2; the adapter then moved (an update): step 2 trains them
    with torch.no_grad():
        for name, parameter in student.model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0.0, 0.5)
    steps = [1, 1, 2, 2]
    group = TrajectoryGroup(
        scenario_id="s", trajectories=[trajectory(c, s, float(i)) for i, (c, s) in enumerate(zip(served, steps))]
    )
    rewards = [WeightedReward("environment", 1.0, EnvironmentReward())]
    scored = score_trajectories("external", [group], student.tokenizer, rewards, False, None, "off", step=2)
    samples = scored.train_samples(use_engine_logprobs=False)  # the transformers engine
    assert [s.engine_logprobs is not None for s in samples] == [True, True, False, False]
    trained = [p for p, m in zip(samples[0].engine_logprobs, samples[0].train_mask) if m]
    assert trained == list(served[0].logprobs)
    # Two iterations: the weights are fixed before the first update (with one, the gradient pass takes them).
    grpo = GrpoSpec.model_validate({"learning_rate": 1e-2, "iterations": 2})
    optimizer = make_optimizer(student.trainable_parameters(), grpo, "cpu")
    updater = GrpoUpdater(student, optimizer, make_scheduler(optimizer, grpo), grpo, importance_sampling_cap=2.0)
    (micro,), _ = updater.prepare(samples, micro_batch_size=4)
    mask = micro.batch.completion_mask.bool()
    weights = micro.importance_weights
    off, on = weights[:2][mask[:2]], weights[2:][mask[2:]]
    assert (off - 1.0).abs().max() > 1e-3  # corrected: the served policy is not the trained one
    assert torch.allclose(on, torch.ones_like(on))  # on-policy samples in the same batch: weight 1
    assert float(off.max()) <= 2.0
