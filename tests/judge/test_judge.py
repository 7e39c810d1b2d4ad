"""The Judge's batching, retries, neutral fallbacks, timeout, counters and cache, on scripted judge outputs."""

from __future__ import annotations

import json
import re
import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from appliance.config.schema import JudgeSpec, RewardSpec
from appliance.judge import Judge
from appliance.judge.grouping import reference_anchor
from appliance.rewards.extract import extract_answer
from appliance.rewards.registry import BatchReward, RewardSample, build_rewards, score_samples

RETRY_MARK = "could not be used"


def spec(**overrides) -> JudgeSpec:
    return JudgeSpec(model="judge-model", **overrides)


def sample(
    completion: str, group: int = 0, prompt: str = "What is 6 x 7?", reference: str | None = "42"
) -> RewardSample:
    return RewardSample(prompt=prompt, completion=completion, reference=reference, group=group)


def scripted(table: dict[str, str | tuple[str, ...]]):
    """Answer by the first marker found in the prompt; a tuple gives the answers for attempt 1, 2, ...

    Answers are what the model generates after the prefill the prompt ends with
    ('{"score": ' pointwise, '{"scores": [{"id": "1", "score": ' in group mode).
    """

    def answer(prompt: str) -> str:
        attempt = prompt.count(RETRY_MARK)
        for marker, texts in table.items():
            if marker in prompt:
                texts = (texts,) if isinstance(texts, str) else texts
                return texts[min(attempt, len(texts) - 1)]
        raise AssertionError(f"no scripted answer for prompt: {prompt[:200]}")

    return answer


def advantages(scores: list[float], groups: list[int]) -> list[float]:
    means = {g: statistics.fmean(s for s, h in zip(scores, groups) if h == g) for g in set(groups)}
    return [s - means[g] for s, g in zip(scores, groups)]


def test_pointwise_judges_a_step_in_one_generate_call(scripted_engine):
    engine = scripted_engine(
        scripted(
            {"A1": '9, "reason": "right"}', "A2": '2, "reason": "wrong"}\nDone.', "B1": '```json\n{"score": 5}\n```'}
        )
    )
    judge = Judge(spec(), engine, log_path=None)
    scores = judge([sample("A1"), sample("A2"), sample("B1", group=1, prompt="What is 2 x 3?", reference="6")])
    assert scores == pytest.approx([0.9, 0.2, 0.5])
    assert len(engine.calls) == 1 and len(engine.calls[0][0]) == 3
    assert judge.outcomes == {"ok": 3, "parse_error": 0, "timeout": 0}
    assert "Reference answer:\n42" in engine.calls[0][0][0] and "Reference answer:\n6" in engine.calls[0][0][2]
    # The answer is started for the model, so it continues with a score.
    assert all(prompt.endswith('</user>\n{"score": ') for prompt in engine.calls[0][0])


def test_a_bad_answer_is_retried_at_lower_temperature_with_the_problem_fed_back(scripted_engine):
    engine = scripted_engine(scripted({"A1": ("15}", '8, "reason": "ok"}'), "A2": "4}"}))
    judge = Judge(spec(temperature=0.8, retries=2), engine, log_path=None)
    assert judge([sample("A1"), sample("A2")]) == pytest.approx([0.8, 0.4])
    assert [sampling.temperature for _, sampling in engine.calls] == pytest.approx([0.8, 0.4])
    retry_prompts = engine.calls[1][0]
    assert len(retry_prompts) == 1 and "score 15 is outside 0 to 10" in retry_prompts[0]
    assert judge.outcomes["ok"] == 2 and judge.stats()["retries"] == 1


def test_exhausted_retries_fall_back_to_a_score_with_zero_advantage(scripted_engine):
    engine = scripted_engine(
        scripted({"A1": "9}", "A2": "3}", "A3": "I think it is fine.", "B1": "NaN}", "B2": '"high"}'})
    )
    judge = Judge(spec(retries=2), engine, log_path=None)
    groups = [0, 0, 0, 1, 1]
    samples = [
        sample("A1"),
        sample("A2"),
        sample("A3"),
        sample("B1", group=1, prompt="2 x 3?", reference="6"),
        sample("B2", group=1, prompt="2 x 3?", reference="6"),
    ]
    scores = judge(samples)
    assert len(engine.calls) == 3  # the first try and two retries; the failures never raise
    assert judge.outcomes == {"ok": 2, "parse_error": 3, "timeout": 0}
    # The unjudged member of group 0 gets the mean of the judged ones: zero advantage for it,
    # and the judged members keep the advantages they would have had without it.
    assert scores[2] == pytest.approx(0.6)
    assert advantages(scores, groups)[:3] == pytest.approx([0.3, -0.3, 0.0])
    # Group 1 was not judged at all: one constant for the whole group.
    assert scores[3] == scores[4] == 0.5 and advantages(scores, groups)[3:] == [0.0, 0.0]


def test_zero_retries_means_one_attempt(scripted_engine):
    engine = scripted_engine(scripted({"A1": "", "A2": "6}"}))
    judge = Judge(spec(retries=0), engine, log_path=None)
    assert judge([sample("A1"), sample("A2")]) == pytest.approx([0.6, 0.6])
    assert len(engine.calls) == 1 and judge.outcomes["parse_error"] == 1


def test_no_retry_starts_after_the_timeout(scripted_engine):
    now = [1000.0]
    engine = scripted_engine(scripted({"A1": "99}", "A2": "1}"}), on_generate=lambda: now.__setitem__(0, now[0] + 30.0))
    judge = Judge(spec(retries=3, timeout_seconds=20.0), engine, log_path=None, clock=lambda: now[0])
    scores = judge([sample("A1"), sample("A2")])
    assert len(engine.calls) == 1
    assert judge.outcomes == {"ok": 1, "parse_error": 0, "timeout": 1}
    assert scores == pytest.approx([0.1, 0.1])


GROUP_BLOCK = re.compile(r'<response id="(\d+)" key="[0-9a-f]+">\n(.*?)\n</response key=', re.DOTALL)


def group_scorer(score_of: dict[str, int], default: int = 0):
    """A scripted group judge: scores each response block by its text, whatever id the shuffle gave it."""

    def answer(prompt: str) -> str:
        entries = [
            f'{{"id": "{i}", "score": {score_of.get(text, default)}, "explanation": "x"}}'
            for i, text in GROUP_BLOCK.findall(prompt)
        ]
        first = entries[0].split('"score": ', 1)[1]  # the prompt ends with the first entry's opening
        return ", ".join([first] + entries[1:]) + "]}"

    return answer


def test_group_mode_reads_each_group_in_several_orders(scripted_engine):
    engine = scripted_engine(group_scorer({"42": 10, "forty": 2, "6": 7, "six": 7, "5": 0}))
    judge = Judge(spec(mode="group", max_new_tokens=50), engine, log_path=None)
    samples = [
        sample("forty"),
        sample("42"),
        sample("6", group=1, prompt="What is 2 x 3?", reference="6"),
        sample("six", group=1, prompt="What is 2 x 3?", reference="6"),
        sample("5", group=1, prompt="What is 2 x 3?", reference="6"),
    ]
    assert judge(samples) == pytest.approx([0.2, 1.0, 0.7, 0.7, 0.0])
    prompts, sampling = engine.calls[0]
    # In one call: the group of two in its two orders, the group of three in four (judge.group_orders).
    assert len(engine.calls) == 1 and len(prompts) == 6
    assert prompts[0].count("What is 6 x 7?") == 1
    forward, backward = ([text for _, text in GROUP_BLOCK.findall(prompt)] for prompt in prompts[:2])
    assert sorted(forward) == ["42", "forty"] and backward == forward[::-1]
    assert prompts[3].endswith('</user>\n{"scores": [{"id": "1", "score": ')
    assert sampling.max_new_tokens == 150  # the per-response budget times the largest group
    assert judge.outcomes["ok"] == 6


def test_group_mode_judges_identical_completions_once_with_one_score(scripted_engine):
    engine = scripted_engine(group_scorer({"<answer>42</answer>": 9, "<answer>41</answer>": 3}))
    judge = Judge(spec(mode="group"), engine, log_path=None)
    texts = ["<answer>42</answer>", "<answer>41</answer>", "<answer>42</answer>", "<answer>42</answer>"]
    scores = judge([sample(text) for text in texts])
    assert scores == pytest.approx([0.9, 0.3, 0.9, 0.9])
    for prompt in engine.calls[0][0]:
        assert len(GROUP_BLOCK.findall(prompt)) == 2  # each distinct text once: no copy pays judge tokens


def test_group_order_is_shuffled_by_the_seed_not_by_the_sampler(scripted_engine):
    texts = [f"<answer>{n}</answer>" for n in range(8)]

    def order(seed: int, given: list[str]) -> list[str]:
        engine = scripted_engine(group_scorer({}))
        Judge(spec(mode="group", cache=False), engine, log_path=None, seed=seed)([sample(t) for t in given])
        return [text for _, text in GROUP_BLOCK.findall(engine.calls[0][0][0])]

    first = order(0, texts)
    assert sorted(first) == sorted(texts)
    assert order(0, list(reversed(texts))) == first  # where the sampler put a completion says nothing
    assert first != texts and any(order(seed, texts) != first for seed in (1, 2, 3))


def test_failed_readings_get_the_minimum_when_the_job_says_so(scripted_engine, tmp_path):
    engine = scripted_engine(scripted({"A1": "9}", "A2": "nonsense"}))
    judge = Judge(spec(retries=0, on_failure="minimum"), engine, log_path=tmp_path / "judge.jsonl")
    assert judge([sample("A1"), sample("A2")]) == pytest.approx([0.9, 0.0])
    assert judge.last_failed == [False, True] and judge.stats()["failed_samples"] == 1
    records = [json.loads(line) for line in (tmp_path / "judge.jsonl").read_text().splitlines()]
    assert sorted(record["failed"] for record in records) == [[False], [True]]
    default = Judge(spec(retries=0), scripted_engine(scripted({"A1": "9}", "A2": "nonsense"})), log_path=None)
    assert default([sample("A1"), sample("A2")]) == pytest.approx([0.9, 0.9])  # group mean: no advantage


def test_group_with_a_missing_id_is_retried_then_scored_as_a_constant(scripted_engine):
    engine = scripted_engine(scripted({"What is 6 x 7?": "9}]}"}))
    judge = Judge(spec(mode="group", retries=1), engine, log_path=None)
    scores = judge([sample("a"), sample("b"), sample("c")])
    assert "missing ids: 2, 3" in engine.calls[1][0][0]
    assert scores == [0.5, 0.5, 0.5]
    assert judge.outcomes == {"ok": 0, "parse_error": 4, "timeout": 0}  # every order


def test_identical_pairs_are_judged_once_per_job(scripted_engine):
    engine = scripted_engine(scripted({"A1": "9}", "A2": "3}"}))
    judge = Judge(spec(), engine, log_path=None)
    assert judge([sample("A1"), sample("A1"), sample("A2")]) == pytest.approx([0.9, 0.9, 0.3])
    assert len(engine.calls[0][0]) == 2
    assert judge([sample("A2"), sample("A1")]) == pytest.approx([0.3, 0.9])
    assert len(engine.calls) == 1 and judge.stats()["cache_hits"] == 2
    judge([sample("A1", reference="43")])  # another reference is another question
    assert len(engine.calls) == 2


def test_failures_are_not_cached(scripted_engine):
    engine = scripted_engine(scripted({"A1": "no idea"}))
    judge = Judge(spec(retries=0), engine, log_path=None)
    judge([sample("A1")])
    judge([sample("A1")])
    assert len(engine.calls) == 2 and judge.outcomes["parse_error"] == 2


def test_cache_off_judges_every_sample(scripted_engine):
    engine = scripted_engine(scripted({"A1": "9}"}))
    judge = Judge(spec(cache=False), engine, log_path=None)
    judge([sample("A1"), sample("A1")])
    judge([sample("A1")])
    assert [len(prompts) for prompts, _ in engine.calls] == [2, 1]


def test_group_cache_is_keyed_by_the_whole_group(scripted_engine):
    engine = scripted_engine(group_scorer({"42": 10, "forty": 2, "41": 3}))
    judge = Judge(spec(mode="group"), engine, log_path=None)
    first = judge([sample("forty"), sample("42")])
    assert judge([sample("forty"), sample("42")]) == first and len(engine.calls) == 1
    assert judge([sample("42"), sample("forty")]) == first[::-1] and len(engine.calls) == 1  # order-free key
    judge([sample("forty"), sample("41")])
    assert len(engine.calls) == 2


def test_log_has_one_line_per_request_with_its_fields(scripted_engine, tmp_path):
    engine = scripted_engine(scripted({"A1": ("oops", '7, "reason": "ok"}'), "A2": "1}"}))
    log_path = tmp_path / "jobs" / "7" / "judge.jsonl"
    judge = Judge(spec(), engine, log_path=log_path)
    judge.set_step(12)
    judge([sample("A1"), sample("A2"), sample("A2")])
    judge.close()
    lines = [json.loads(line) for line in log_path.read_text().splitlines()]
    assert len(lines) == 2
    first = lines[0]
    assert {
        "step",
        "mode",
        "prompt",
        "raw_output",
        "scores",
        "outcome",
        "retries",
        "latency_seconds",
        "tokens_in",
        "tokens_out",
    } <= set(first)
    assert (first["step"], first["mode"], first["outcome"], first["retries"]) == (12, "pointwise", "ok", 1)
    assert first["raw_output"] == '{"score": 7, "reason": "ok"}' and first["earlier_outputs"] == ['{"score": oops']
    assert "A1" in first["prompt"] and first["scores"] == [0.7]
    assert first["tokens_in"] > 0 and first["tokens_out"] > 0
    assert lines[1]["assigned"] == [0.1, 0.1]


def test_counters_for_metrics(scripted_engine):
    engine = scripted_engine(scripted({"A1": "one two three", "A2": "1}"}))
    judge = Judge(spec(retries=1), engine, log_path=None)
    judge([sample("A1"), sample("A2")])
    stats = judge.stats()
    assert stats["outcomes"] == {"ok": 1, "parse_error": 1, "timeout": 0}
    assert (stats["calls"], stats["requests"], stats["failures"], stats["failure_rate"]) == (2, 2, 1, 0.5)
    assert stats["generated_tokens"] == 3 + 1 + 3  # A1 twice, A2 once (the scripted engine counts words)
    assert stats["prompt_tokens"] == judge.counters.prompt_tokens > 0


def test_judge_is_the_judge_batch_reward(scripted_engine, tmp_path):
    engine = scripted_engine(scripted({"A1": "10}", "A2": "0}"}))
    judge = Judge(spec(), engine, log_path=None)
    assert isinstance(judge, BatchReward) and judge.name == "judge"
    rewards = build_rewards([RewardSpec(name="judge", weight=2.0)], tmp_path, judge=judge)
    scores = score_samples(rewards, [sample("A1"), sample("A2")])
    assert scores.total == pytest.approx([2.0, 0.0])


def test_empty_step_costs_nothing(scripted_engine):
    engine = scripted_engine(scripted({}))
    assert Judge(spec(), engine, log_path=None)([]) == [] and engine.calls == []


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(max_size=80), min_size=1, max_size=6), st.integers(-(10**6), 10**6))
def test_only_extracted_numbers_stand_in_a_groups_anchor(texts, reference):
    # A response reaches the judge's own answer lines only as the number the correctness rule reads from it.
    anchor = reference_anchor(f"#### {reference}", texts)
    assert anchor is not None and anchor.reference == str(reference)
    for text, answer in zip(texts, anchor.answers, strict=True):
        assert answer == (extract_answer(text) or "")
        assert re.fullmatch(r"(-?\d+(\.\d+)?(/\d+)?)?", answer), answer
    assert reference_anchor("a friendly greeting", texts) is None  # no number to agree with: no anchor
