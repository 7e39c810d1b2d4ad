"""The trainer's view of the judge (grpo/records.py), over the real Judge on scripted judge outputs."""

from __future__ import annotations

import json

import pytest

from appliance.config.schema import JudgeSpec
from appliance.grpo.records import JudgeSeat, NoJudge, judging_for
from appliance.judge import Judge
from appliance.rewards.registry import RewardSample


def _samples(*texts: str) -> list[RewardSample]:
    return [RewardSample(prompt="What is 6 x 7?", completion=text, reference="42", group=0) for text in texts]


@pytest.fixture
def timed_judge(scripted_engine, tmp_path):
    """A pointwise judge whose every generate call takes 2 seconds of its clock."""
    now = [100.0]
    engine = scripted_engine(lambda prompt: "9}" if "A1" in prompt else "2}")
    engine.on_generate = lambda: now.__setitem__(0, now[0] + 2.0)
    return Judge(JudgeSpec(model="judge-model"), engine, log_path=tmp_path / "judge.jsonl", clock=lambda: now[0])


def test_no_judge_records_what_a_step_without_one_recorded(tmp_path):
    judging = judging_for(None)
    assert isinstance(judging, NoJudge) and judging.engine is None and judging.engines() == []
    judging.set_step(3)
    assert judging.totals() == {} and judging.outcomes() == {}
    seconds = {"generate": 1.0, "reward": 0.5}
    assert judging.split_seconds(seconds, {"student": (0, 0)}) == {"generate": 1.0, "reward": 0.5}
    judging.log_to(tmp_path / "judge.rank1.jsonl")
    judging.close()
    assert list(tmp_path.iterdir()) == []


def test_the_judges_share_of_the_reward_phase_becomes_its_own_phase(timed_judge):
    judging = judging_for(timed_judge)
    assert isinstance(judging, JudgeSeat) and judging.engines() == [timed_judge.engine] == [judging.engine]
    before = judging.totals()
    assert before == {"judge": (0, 0), "judge_seconds": 0.0}
    judging.set_step(1)
    assert timed_judge(_samples("A1", "A2")) == pytest.approx([0.9, 0.2])
    after = judging.totals()
    assert after["judge"][0] > 0 and after["judge"][1] > 0 and after["judge_seconds"] == pytest.approx(2.0)
    seconds = judging.split_seconds({"generate": 1.0, "reward": 2.5, "train": 3.0}, before)
    assert seconds == pytest.approx({"generate": 1.0, "reward": 0.5, "train": 3.0, "judge": 2.0})
    # A judge timed past the reward phase's own clock never makes the reward phase negative.
    assert judging.split_seconds({"generate": 1.0}, before) == {"generate": 1.0, "judge": 2.0, "reward": 0.0}


def test_outcomes_are_a_copy_and_the_log_follows_the_step_and_the_rank(timed_judge, tmp_path):
    judging = judging_for(timed_judge)
    judging.set_step(4)
    timed_judge(_samples("A1", "A2"))
    outcomes = judging.outcomes()
    assert outcomes == {"ok": 2, "parse_error": 0, "timeout": 0}
    outcomes["ok"] = 99
    assert timed_judge.outcomes["ok"] == 2
    judging.log_to(tmp_path / "judge.rank1.jsonl")
    judging.set_step(5)
    timed_judge(_samples("A3"))  # not a cached verdict: a new log line
    judging.close()
    rank0 = [json.loads(line) for line in (tmp_path / "judge.jsonl").read_text().splitlines()]
    rank1 = [json.loads(line) for line in (tmp_path / "judge.rank1.jsonl").read_text().splitlines()]
    assert [line["step"] for line in rank0] == [4, 4] and [line["step"] for line in rank1] == [5]


def test_a_judge_without_a_log_stays_without_one(scripted_engine, tmp_path):
    judge = Judge(JudgeSpec(model="judge-model"), scripted_engine(lambda prompt: "5}"), log_path=None)
    judging_for(judge).log_to(tmp_path / "judge.rank1.jsonl")
    assert judge.log is None and list(tmp_path.iterdir()) == []
