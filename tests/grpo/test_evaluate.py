"""Held-out evaluation, greedy and sampled (checkpoint.eval_temperature / eval_samples), on a tiny random Llama.

The tiny model is right about nothing, so these tests check what the evaluation draws and counts: how many
draws the shares are over, that a fixed seed replays the same draws (the base before training and the adapter
after see the same ones), and that a sampled evaluation of an agent job plays the greedy one's scenarios.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from appliance.agents.environment_loader import load_environment
from appliance.config.schema import TaskSpec
from appliance.grpo.distributed import share
from appliance.grpo.evaluate import GREEDY, EvalSampling, Evaluation, evaluate, evaluate_environment, merge_evaluations
from appliance.tasks.load import load_task


@pytest.fixture(scope="module")
def task():
    return load_task(TaskSpec(dataset="builtin:multiply", held_out=3), Path("."))


def test_sampled_question_evaluation_counts_every_draw_and_replays_with_its_seed(tiny_engine, task):
    how = EvalSampling(temperature=1.0, samples=4, seed=11)
    first = evaluate(tiny_engine, task, task.held_out, [], max_new_tokens=8, how=how)
    assert (first.problems, first.samples, first.draws, first.temperature) == (3, 4, 12, 1.0)
    assert len(first.per_problem) == 3 and first.accuracy == sum(first.per_problem) / 3
    again = evaluate(tiny_engine, task, task.held_out, [], max_new_tokens=8, how=how)
    assert [e["completion"] for e in again.examples] == [e["completion"] for e in first.examples]
    assert again.completion_length_mean == first.completion_length_mean
    other = evaluate(tiny_engine, task, task.held_out, [], max_new_tokens=8, how=EvalSampling(1.0, 4, seed=12))
    assert [e["completion"] for e in other.examples] != [e["completion"] for e in first.examples]

    greedy = evaluate(tiny_engine, task, task.held_out, [], max_new_tokens=8)
    assert (greedy.problems, greedy.samples, greedy.draws, greedy.temperature) == (3, 1, 3, 0.0)
    assert (greedy.summary().temperature, greedy.summary().samples) == (0.0, 1)
    assert (first.summary().temperature, first.summary().samples) == (1.0, 4)  # what the step records carry


def test_sampled_agent_evaluation_plays_the_greedy_scenarios_several_times(tiny_engine):
    environment = load_environment("builtin:calculator", Path("."), {})
    environment.max_turns = 1
    how = EvalSampling(temperature=1.0, samples=3, seed=5)
    sampled = evaluate_environment(environment, tiny_engine, scenarios=2, max_new_tokens=8, how=how)
    assert (sampled.problems, sampled.samples, sampled.draws) == (2, 3, 6) and len(sampled.per_problem) == 2
    greedy = evaluate_environment(environment, tiny_engine, scenarios=2, max_new_tokens=8, how=EvalSampling(seed=5))
    assert (greedy.problems, greedy.draws) == (2, 2)
    assert [e["scenario"] for e in sampled.examples] == [e["scenario"] for e in greedy.examples]
    again = evaluate_environment(environment, tiny_engine, scenarios=2, max_new_tokens=8, how=how)
    assert [e["messages"] for e in again.examples] == [e["messages"] for e in sampled.examples]


@pytest.mark.parametrize("temperature, samples", [(0.0, 2), (-1.0, 1), (1.0, 0)])
def test_evaluation_sampling_refuses_what_cannot_mean_anything(temperature, samples):
    with pytest.raises(ValueError):
        EvalSampling(temperature, samples)


def test_greedy_leaves_the_process_generator_alone_and_sampling_is_seeded():
    assert GREEDY.engine_sampling(16).seed is None and GREEDY.engine_sampling(16).temperature == 0.0
    sampling = EvalSampling(0.8, 4, seed=3).engine_sampling(16)
    assert (sampling.n, sampling.temperature, sampling.seed, sampling.max_new_tokens) == (4, 0.8, 3, 16)


def _evaluation(per_problem: list[float], samples: int, lengths: float, examples: list[str]) -> Evaluation:
    draws = len(per_problem) * samples
    return Evaluation(
        problems=len(per_problem),
        accuracy=sum(per_problem) / len(per_problem),
        format_compliance=0.5,
        reward_means={"correctness": sum(per_problem) / len(per_problem), "total": 1.0},
        completion_length_mean=lengths,
        seconds=float(len(per_problem)),
        examples=[{"completion": text} for text in examples],
        temperature=1.0,
        samples=samples,
        draws=draws,
        per_problem=per_problem,
    )


def test_the_parts_data_parallel_ranks_evaluate_merge_into_one_evaluation_of_every_problem():
    problems = list(range(7))
    parts = [share(problems, rank, 3) for rank in range(3)]
    assert parts == [[0, 1, 2], [3, 4], [5, 6]]  # every problem once, in order, however uneven
    assert [share(problems[:2], rank, 3) for rank in range(3)] == [[0], [1], []]

    first = _evaluation([1.0, 1.0, 0.5], samples=2, lengths=10.0, examples=["a", "b", "c"])
    second = _evaluation([0.0, 0.0], samples=2, lengths=20.0, examples=["d", "e"])
    merged = merge_evaluations([first, second], examples=4)
    assert (merged.problems, merged.draws, merged.samples) == (5, 10, 2)
    assert merged.per_problem == [1.0, 1.0, 0.5, 0.0, 0.0]
    assert merged.accuracy == pytest.approx(2.5 / 5)  # over all draws, not the parts' mean ((0.83 + 0) / 2)
    assert merged.completion_length_mean == pytest.approx((6 * 10.0 + 4 * 20.0) / 10)
    assert merged.reward_means == pytest.approx({"correctness": 0.5, "total": 1.0})
    assert [e["completion"] for e in merged.examples] == ["a", "b", "c", "d"] and merged.seconds == 3.0
    assert merge_evaluations([first]) is first


def test_ranks_with_no_held_out_problem_evaluate_nothing_and_the_merge_counts_every_problem_once(tiny_engine, task):
    """More ranks than held-out problems (held_out: 1 over 2 ranks, or an eval_limit under the rank count): a rank
    whose share is empty evaluates nothing, and the merge is over the problems the others drew."""
    from appliance.config.schema import RewardSpec
    from appliance.rewards.registry import build_rewards

    specs = [RewardSpec(name="correctness", weight=1.0), RewardSpec(name="answer_format", weight=0.5)]
    rewards = build_rewards(specs, Path("."))
    problems = task.held_out[:2]
    for ranks in (1, 2, 3, 5):
        parts = [
            evaluate(tiny_engine, task, share(problems, rank, ranks), rewards, max_new_tokens=4)
            for rank in range(ranks)
        ]
        merged = merge_evaluations(parts)
        assert (merged.problems, merged.draws, len(merged.per_problem)) == (2, 2, 2), ranks
        assert set(merged.reward_means) == {"correctness", "answer_format", "total"}, ranks
        assert all(0.0 <= value <= 1.5 for value in merged.reward_means.values()), merged.reward_means
    empty = evaluate(tiny_engine, task, [], rewards, max_new_tokens=4)
    assert (empty.problems, empty.draws, empty.accuracy, empty.per_problem) == (0, 0, 0.0, [])
