"""Held-out evaluation, greedy and sampled (checkpoint.eval_temperature / eval_samples), on a tiny random Llama.

The tiny model is right about nothing, so these tests check what the evaluation draws and counts: how many
draws the shares are over, that a fixed seed replays the same draws (the base before training and the adapter
after see the same ones), and that a sampled evaluation of an agent job plays the greedy one's scenarios.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from appliance.agents.loading import load_environment
from appliance.config.schema import TaskSpec
from appliance.grpo.evaluate import GREEDY, EvalSampling, evaluate, evaluate_environment
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
