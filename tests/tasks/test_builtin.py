"""builtin:multiply and builtin:gsm8k: what is trained on, what is held out, how prompts look."""

from __future__ import annotations

from pathlib import Path

import pytest

from appliance.config.schema import FewShotExample, TaskSpec
from appliance.rewards.extract import answers_match, extract_answer
from appliance.tasks import TaskError, load_task
from appliance.tasks.gsm8k import GSM8K_TRAIN_SIZE, gsm8k_path, load_gsm8k


def multiply(**settings):
    spec = TaskSpec(dataset="builtin:multiply", **{"operand_min": 2, "operand_max": 12, "held_out": 21, **settings})
    return load_task(spec, Path("."))


def test_multiply_covers_every_ordered_pair_once():
    task = multiply()
    pairs = [(p.metadata["a"], p.metadata["b"]) for p in task.train + task.held_out]
    assert sorted(pairs) == [(a, b) for a in range(2, 13) for b in range(2, 13)]
    assert (len(task.train), len(task.held_out)) == (100, 21)


def test_multiply_held_out_is_never_trained_on():
    task = multiply()
    assert {p.id for p in task.train}.isdisjoint({p.id for p in task.held_out})
    assert {p.question for p in task.train}.isdisjoint({p.question for p in task.held_out})


def test_multiply_questions_and_answers():
    task = multiply()
    problem = next(p for p in task.train + task.held_out if p.metadata == {"a": 7, "b": 12})
    assert problem.question == "What is 7 * 12?"
    assert problem.answer == "84"


def test_multiply_split_is_deterministic_per_seed():
    assert multiply(seed=3).held_out == multiply(seed=3).held_out
    assert multiply(seed=3).train == multiply(seed=3).train
    assert [p.id for p in multiply(seed=3).held_out] != [p.id for p in multiply(seed=4).held_out]


def test_multiply_held_out_too_large_names_the_key():
    with pytest.raises(TaskError, match=r"task\.held_out \(121\) must be smaller than the 121 multiply problems"):
        multiply(held_out=121)


def test_unknown_builtin_suggests_the_closest():
    with pytest.raises(TaskError, match=r"unknown built-in 'builtin:gsm9k'; did you mean 'builtin:gsm8k'"):
        load_task(TaskSpec(dataset="builtin:gsm9k"), Path("."))


def test_messages_system_prompt_then_few_shot_then_question():
    task = multiply(
        system_prompt="Answer in <answer></answer>.",
        few_shot=[FewShotExample(question="What is 2 * 3?", answer="<answer>6</answer>")],
    )
    problem = task.train[0]
    assert task.messages(problem) == [
        {"role": "system", "content": "Answer in <answer></answer>."},
        {"role": "user", "content": "What is 2 * 3?"},
        {"role": "assistant", "content": "<answer>6</answer>"},
        {"role": "user", "content": problem.question},
    ]


def test_messages_without_system_prompt_is_just_the_question():
    task = multiply()
    assert task.messages(task.train[0]) == [{"role": "user", "content": task.train[0].question}]


def test_gsm8k_ships_the_whole_train_split():
    problems = load_gsm8k()
    assert len(problems) == GSM8K_TRAIN_SIZE == 7473
    assert len({p.id for p in problems}) == 7473
    assert (gsm8k_path().parent / "LICENSE").read_text().startswith("MIT License")


def test_gsm8k_answer_is_the_final_number_and_solution_is_kept():
    first = load_gsm8k()[0]
    assert first.question.startswith("Natalia sold clips to 48 of her friends in April")
    assert first.answer == "72"
    assert first.metadata["solution"].endswith("#### 72")
    assert answers_match(first.metadata["solution"], first.answer)


def test_gsm8k_thousands_commas_are_removed():
    answers = {p.answer for p in load_gsm8k()}
    assert "1080" in answers  # written "#### 1,080" in the file
    assert not any("," in answer for answer in answers)


def test_gsm8k_task_split():
    task = load_task(TaskSpec(dataset="builtin:gsm8k", held_out=200, seed=0), Path("."))
    assert (len(task.train), len(task.held_out)) == (7273, 200)
    assert {p.id for p in task.train}.isdisjoint({p.id for p in task.held_out})
    again = load_task(TaskSpec(dataset="builtin:gsm8k", held_out=200, seed=0), Path("."))
    assert [p.id for p in again.held_out] == [p.id for p in task.held_out]


def test_every_gsm8k_solution_extracts_to_its_own_answer():
    """The reward's extractor reads all 7473 worked solutions the way the dataset means them."""
    mismatched = [p.id for p in load_gsm8k() if extract_answer(p.metadata["solution"]) != p.answer]
    assert mismatched == []
