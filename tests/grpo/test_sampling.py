"""Dynamic sampling and prompt skipping (grpo/rollout.py) on real rollouts and the real data cursor, no model."""

from __future__ import annotations

import pytest

from appliance.engines.engine import Completion
from appliance.grpo.rollout import scored_rollout
from appliance.grpo.rollout import PromptSkipper, SamplingRounds, round_seed
from appliance.rewards.registry import RewardScores
from appliance.tasks.task import Problem
from appliance.tasks.stream import ProblemStream

GROUP = 4


def _problems(count: int) -> list[Problem]:
    return [Problem(id=f"p{i}", question=f"What is {i} * 2?", answer=str(2 * i)) for i in range(count)]


def _round(problems: list[Problem], rewards: list[list[float]]):
    """A scored round: each problem's group earns the given rewards."""
    groups = [
        [Completion(i, [1, 2], [3 + j], f"answer {j}", [-0.5], "stop") for j in range(len(group))]
        for i, group in enumerate(rewards)
    ]
    total = [value for group in rewards for value in group]
    return scored_rollout(problems, [p.question for p in problems], groups, RewardScores({"r": total}, total), True)


SPREAD, FLAT = [1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0]


def test_dynamic_sampling_fills_the_batch_with_informative_groups_and_trains_only_those():
    problems = _problems(12)
    rounds = SamplingRounds(target=4, max_rounds=3)
    rounds.add(_round(problems[0:4], [SPREAD, FLAT, FLAT, SPREAD]))  # 2 informative
    assert rounds.wants_more()
    rounds.add(_round(problems[4:8], [FLAT, SPREAD, SPREAD, SPREAD]))  # 3 more: 5 >= 4
    assert not rounds.wants_more()
    merged = rounds.rollout()
    assert len(merged.groups) == 8 and int(merged.advantages.informative.sum()) == 5  # the record counts all
    assert merged.selected.tolist() == [True, False, False, True, False, True, True, False]
    trained_prompts = {sample.prompt_ids[0] for sample in merged.train_samples(use_engine_logprobs=False)}
    assert trained_prompts == {1} and len(merged.train_samples(False)) == 4 * GROUP  # 4 groups x 4 completions
    assert [merged.problems[i].id for i in range(8) if merged.selected[i]] == ["p0", "p3", "p5", "p6"]


def test_dynamic_sampling_stops_at_its_bound_with_what_it_has():
    problems = _problems(12)
    rounds = SamplingRounds(target=4, max_rounds=2)
    rounds.add(_round(problems[0:4], [FLAT, FLAT, SPREAD, FLAT]))
    assert rounds.wants_more()
    rounds.add(_round(problems[4:8], [FLAT, FLAT, FLAT, FLAT]))
    assert not rounds.wants_more()  # 1 informative of 4 wanted, but the bound is reached
    merged = rounds.rollout()
    assert merged.selected.tolist() == [False, False, True, False, False, False, False, False]


def test_one_round_is_a_plain_step_and_a_full_first_round_needs_no_second():
    rounds = SamplingRounds(target=2, max_rounds=1)
    rounds.add(_round(_problems(2), [FLAT, FLAT]))
    assert not rounds.wants_more() and rounds.rollout().selected.tolist() == [False, False]
    full = SamplingRounds(target=2, max_rounds=5)
    full.add(_round(_problems(2), [SPREAD, SPREAD]))
    assert not full.wants_more()


def test_rounds_refuse_nonsense_bounds_and_an_empty_rollout():
    with pytest.raises(ValueError, match="at least 1"):
        SamplingRounds(target=0, max_rounds=2)
    with pytest.raises(ValueError, match="no generation round"):
        SamplingRounds(target=2, max_rounds=2).rollout()


def test_later_rounds_draw_with_seeds_of_their_own():
    assert round_seed(1234, 0) == 1234
    assert len({round_seed(1234, index) for index in range(4)}) == 4


def _appearances(skipper: PromptSkipper, verdicts, count: int, watched: str = "p0") -> str:
    """Draw batches of one until `watched` has appeared `count` times in the data order: "G" for each appearance
    generated, "S" for each skipped. verdicts(appearance) says whether its group has spread."""
    stream = skipper.stream
    size = len(stream.problems)
    order = ProblemStream(stream.problems, seed=stream.seed)  # the same data order, read alone
    events = ""
    while len(events) < count:
        before = stream.epoch * size + stream.position
        (problem,) = skipper.next_batch(1)
        consumed = order.next_batch(stream.epoch * size + stream.position - before)
        for seen in consumed[:-1]:
            events += "S" if seen.id == watched else ""
        assert consumed[-1].id == problem.id
        has_spread = verdicts(len(events)) if problem.id == watched else True
        events += "G" if problem.id == watched else ""
        skipper.observe([problem], [has_spread])
    return events[:count]


def test_a_settled_prompt_is_skipped_then_probed_and_comes_back_when_its_group_regains_spread():
    """K=2: two flat groups in a row settle p0; its next 2 appearances are skipped, the 3rd probes it; the probe's
    group has spread (the policy changed), so p0 is back at every appearance."""
    skipper = PromptSkipper(ProblemStream(_problems(4), seed=0), after=2)
    events = _appearances(skipper, lambda index: index >= 4, count=8)  # flat until its 5th appearance
    assert events == "GGSSGGGG"
    assert not skipper.settled("p0") and skipper.state_dict() == {}


def test_a_probe_without_spread_keeps_the_prompt_settled_for_another_k_appearances():
    skipper = PromptSkipper(ProblemStream(_problems(4), seed=1), after=1)
    assert _appearances(skipper, lambda index: False, count=7) == "GSGSGSG"
    assert skipper.settled("p0")


def test_when_every_prompt_is_settled_the_batch_is_filled_with_probes_instead_of_looping():
    problems = _problems(3)
    skipper = PromptSkipper(ProblemStream(problems, seed=0), after=1)
    skipper.observe(problems, [False, False, False])
    batch = skipper.next_batch(2)
    assert len(batch) == 2  # all settled: one pass of the data, then probes fill the batch
    assert skipper.skipped_last_batch == 1


def test_skipping_off_is_the_plain_data_order():
    problems = _problems(5)
    plain, skipper = ProblemStream(problems, seed=3), PromptSkipper(ProblemStream(problems, seed=3), after=None)
    skipper.observe(problems, [False] * 5)
    assert [p.id for p in skipper.next_batch(7)] == [p.id for p in plain.next_batch(7)]


def test_skipped_prompt_state_round_trips_and_a_damaged_one_is_refused():
    skipper = PromptSkipper(ProblemStream(_problems(3), seed=0), after=2)
    skipper.observe(_problems(2), [False, True])
    state = skipper.state_dict()
    assert state == {"p0": [1, 0]}
    again = PromptSkipper(ProblemStream(_problems(3), seed=0), after=2)
    again.load_state_dict(state)
    assert again.state_dict() == state
    for bad in ({"p0": [1]}, {"p0": "settled"}, {"p0": [-1, 0]}, {"p0": [1.5, 0]}):
        with pytest.raises(ValueError, match="must be \\[streak, skipped\\]"):
            again.load_state_dict(bad)
    with pytest.raises(ValueError, match="at least 1"):
        PromptSkipper(ProblemStream(_problems(3), seed=0), after=0)
