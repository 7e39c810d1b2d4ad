"""Building rewards from job-file specs, user plugins, and the weighted scores of a step."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from appliance.config.schema import RewardSpec
from appliance.rewards import (
    RULES,
    RewardError,
    RewardSample,
    build_rewards,
    known_reward_names,
    score_samples,
)

PERFECT = "<reasoning>\n6 * 7 = 42\n</reasoning>\n<answer>\n42\n</answer>\n"


def samples(*completions: str, reference: str = "42") -> list[RewardSample]:
    return [
        RewardSample(prompt="What is 6 * 7?", completion=text, reference=reference, metadata={}, group=0)
        for text in completions
    ]


def test_known_names_are_the_rules_and_the_judge():
    assert known_reward_names() == [
        "answer_format",
        "correctness",
        "int",
        "length",
        "soft_format",
        "strict_format",
        "xmlcount",
        "judge",
    ]


def test_weighted_sum_and_per_function_stats(tmp_path):
    rewards = build_rewards(
        [RewardSpec(name="correctness", weight=2.0), RewardSpec(name="strict_format", weight=0.5)], tmp_path
    )
    scores = score_samples(rewards, samples(PERFECT, "<answer>42</answer>", "41", "<answer>41</answer>"))

    assert scores.per_function == {"correctness": [1.0, 1.0, 0.0, 0.0], "strict_format": [1.0, 0.0, 0.0, 0.0]}
    assert scores.total == [2.5, 2.0, 0.0, 0.0]
    stats = scores.stats()
    assert stats["correctness"].mean == 0.5
    assert stats["correctness"].std == 0.5
    assert stats["strict_format"].mean == 0.25
    assert stats["strict_format"].std == pytest.approx(0.4330127, abs=1e-6)
    assert stats["total"].mean == 1.125


def test_params_reach_the_rule(tmp_path):
    [reward] = build_rewards([RewardSpec(name="length", weight=1.0, params={"target": 10})], tmp_path)
    assert reward.fn(samples("x" * 60)) == [-0.5]


def test_bad_params_fail_at_build_time(tmp_path):
    with pytest.raises(RewardError, match=r"rewards\[0\] \('length'\).*accepted params: target"):
        build_rewards([RewardSpec(name="length", params={"targte": 10})], tmp_path)
    with pytest.raises(RewardError, match=r"rewards\[0\] \('length'\).*target must be a positive"):
        build_rewards([RewardSpec(name="length", params={"target": 0})], tmp_path)
    with pytest.raises(RewardError, match=r"rewards\[0\] \('length'\)"):
        build_rewards([RewardSpec(name="length")], tmp_path)


def test_a_rule_refusing_its_params_with_a_reward_error_is_named_by_its_entry(tmp_path, monkeypatch):
    def strict(prompt, completion, reference, metadata, limit=1):
        if limit < 1:
            raise RewardError(f"limit must be at least 1, got {limit}")
        return 1.0

    monkeypatch.setitem(RULES, "strict", strict)
    with pytest.raises(RewardError, match=r"^rewards\[1\] \('strict'\): limit must be at least 1, got 0$"):
        build_rewards([RewardSpec(name="correctness"), RewardSpec(name="strict", params={"limit": 0})], tmp_path)


def test_unknown_name_suggests_the_closest(tmp_path):
    with pytest.raises(RewardError, match=r"rewards\[1\] \('corectness'\): unknown reward; did you mean 'correctness'"):
        build_rewards([RewardSpec(name="int"), RewardSpec(name="corectness")], tmp_path)


def test_the_same_reward_twice_is_refused(tmp_path):
    with pytest.raises(RewardError, match="listed twice"):
        build_rewards([RewardSpec(name="int"), RewardSpec(name="int", weight=2.0)], tmp_path)


class GroupJudge:
    """A BatchReward that needs the whole group at once: ranks completions by length within each group."""

    name = "judge"

    def __call__(self, batch: list[RewardSample]) -> list[float]:
        longest = {}
        for sample in batch:
            longest[sample.group] = max(longest.get(sample.group, 0), len(sample.completion))
        return [len(sample.completion) / longest[sample.group] for sample in batch]


def test_judge_is_the_supplied_batch_reward(tmp_path):
    judge = GroupJudge()
    rewards = build_rewards([RewardSpec(name="judge", weight=3.0)], tmp_path, judge=judge)
    assert rewards[0].fn is judge
    batch = [
        RewardSample("q0", "ab", "1", {}, group=0),
        RewardSample("q0", "abcd", "1", {}, group=0),
        RewardSample("q1", "abc", "1", {}, group=1),
    ]
    assert score_samples(rewards, batch).total == [1.5, 3.0, 3.0]


def test_judge_without_a_judge_is_a_clear_error(tmp_path):
    with pytest.raises(RewardError, match="add a 'judge' section"):
        build_rewards([RewardSpec(name="judge")], tmp_path)


def write_plugin(folder: Path, source: str, name: str = "my_rewards.py") -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(source))
    return path


def test_plugin_from_a_file_next_to_the_job(tmp_path):
    (tmp_path / "plugins").mkdir()
    write_plugin(
        tmp_path / "plugins",
        """
        def politeness(prompt, completion, reference, metadata, bonus=1.0):
            return bonus if "please" in completion.lower() else 0.0
        """,
    )
    name = "plugins/my_rewards.py:politeness"
    rewards = build_rewards([RewardSpec(name=name, weight=2.0, params={"bonus": 0.25})], tmp_path)
    scores = score_samples(rewards, samples("Please take 42", "42"))
    assert scores.per_function == {name: [0.25, 0.0]}
    assert scores.total == [0.5, 0.0]


def test_two_plugin_files_with_the_same_name_do_not_collide(tmp_path):
    for folder, value in (("a", 1.0), ("b", 2.0)):
        (tmp_path / folder).mkdir()
        write_plugin(tmp_path / folder, f"def score(prompt, completion, reference, metadata):\n    return {value}\n")
    rewards = build_rewards(
        [RewardSpec(name="a/my_rewards.py:score"), RewardSpec(name="b/my_rewards.py:score")], tmp_path
    )
    assert score_samples(rewards, samples("x")).total == [3.0]


def test_plugin_missing_file(tmp_path):
    with pytest.raises(RewardError, match=r"nope\.py.*does not exist"):
        build_rewards([RewardSpec(name="nope.py:score")], tmp_path)


def test_plugin_missing_function_lists_what_is_there(tmp_path):
    write_plugin(tmp_path, "def brevity(prompt, completion, reference, metadata):\n    return 0.0\n")
    with pytest.raises(
        RewardError, match=r"my_rewards\.py has no function 'brevety' \(functions defined there: brevity\)"
    ):
        build_rewards([RewardSpec(name="my_rewards.py:brevety")], tmp_path)


def test_plugin_import_error_names_the_file(tmp_path):
    write_plugin(tmp_path, "import not_a_real_module_xyz\n")
    with pytest.raises(RewardError, match=r"importing .*my_rewards\.py failed: ModuleNotFoundError"):
        build_rewards([RewardSpec(name="my_rewards.py:score")], tmp_path)


def test_plugin_with_the_wrong_signature(tmp_path):
    write_plugin(tmp_path, "def score(completion):\n    return 1.0\n")
    with pytest.raises(RewardError, match=r"my_rewards\.py:score.*do not fit score\(completion\)"):
        build_rewards([RewardSpec(name="my_rewards.py:score")], tmp_path)


@pytest.mark.parametrize("bad_value", ["None", "float('nan')", "'1.0'"])
def test_plugin_returning_a_non_number_is_named(tmp_path, bad_value):
    write_plugin(tmp_path, f"def score(prompt, completion, reference, metadata):\n    return {bad_value}\n")
    rewards = build_rewards([RewardSpec(name="my_rewards.py:score")], tmp_path)
    with pytest.raises(
        RewardError, match=r"reward 'my_rewards\.py:score' returned .* for sample 0; it must return a finite number"
    ):
        score_samples(rewards, samples("x"))


def test_plugin_that_raises_is_named_with_the_sample(tmp_path):
    write_plugin(tmp_path, "def score(prompt, completion, reference, metadata):\n    return 1 / len(completion)\n")
    rewards = build_rewards([RewardSpec(name="my_rewards.py:score")], tmp_path)
    with pytest.raises(RewardError, match=r"reward 'my_rewards\.py:score' failed on sample 1: ZeroDivisionError"):
        score_samples(rewards, samples("x", ""))
