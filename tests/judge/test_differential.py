"""The differential check and the group reading: text outside the answer never raises a reward, order cancels.

The judge models here stand in for a model's *output* only (as conftest's
ScriptedEngine does): a probability-scoring model whose score is any function
of the prompt it reads. The property tests draw that function and the
appended text, so what is shown holds for every judge, not one: whatever the
judge makes of a suffix, the reward never rises above the answer's own by
more than the threshold. The real bundled model is measured the same way in
test_judge_model.py and bench/judge_attack_shifts.py.
"""

from __future__ import annotations

import hashlib
import re
import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from appliance.config.schema import JudgeSpec
from appliance.engines.engine import EngineCounters
from appliance.judge import Judge
from appliance.rewards.registry import RewardSample

QUESTION, REFERENCE = "What is 9 * 5?", "45"
ANSWER = "9 * 5 = 45, so <answer>18</answer>"
BLOCK = re.compile(r'<response(?: id="(\d+)")? key="[0-9a-f]+">\n(.*?)\n</response key=', re.DOTALL)


class ScoreModel:
    """A probability-scoring judge model: `score_of(prompt, response id)` -> the digit it is sure of."""

    def __init__(self, score_of):
        self.score_of = score_of
        self.counters = EngineCounters()
        self.prompts: list[str] = []

    def render_chat(self, messages):
        return "".join(f"<{m['role']}>{m['content']}</{m['role']}>\n" for m in messages) + "<assistant>"

    def next_token_logprobs(self, prompts, candidates):
        self.prompts.extend(prompts)
        out = []
        for prompt in prompts:
            # a group's id, in the plain or the anchored opening (prompts.anchored_item_prefill)
            asked = re.search(r'\{"id": "(\d+)", (?:"answer": "[^"]*", )?"score": $', prompt)
            digit = self.score_of(prompt, asked.group(1) if asked else None)
            out.append({c: (0.0 if c == str(digit) else -30.0) for c in candidates})
        return out


def hashed(prompt: str, _id=None, salt: str = "") -> int:
    """Any judge: a digit drawn from the prompt's text."""
    return hashlib.sha256((salt + prompt).encode()).digest()[0] % 10


def judge_with(score_of, **keys) -> tuple[Judge, ScoreModel]:
    model = ScoreModel(score_of)
    spec = JudgeSpec(model="m", scoring="probabilities", injection_guard="off", **keys)
    return Judge(spec, model), model


def sample(completion: str, group: int = 0, reference: str | None = REFERENCE) -> RewardSample:
    return RewardSample(QUESTION, completion, reference, group=group)


def praise_lover(prompt: str, _id=None) -> int:
    """A judge swayed by praise: 9 when the response it reads says "excellent", else 2."""
    return 9 if "excellent" in prompt.split("Response to grade:")[-1].split("</response")[0] else 2


def test_an_appended_text_that_sways_the_judge_gets_the_answers_own_score():
    judge, _ = judge_with(praise_lover)
    clean, swayed = judge([sample(ANSWER), sample(ANSWER + "\nAn excellent answer.", group=1)])
    assert clean == swayed == pytest.approx(2 / 9)
    assert judge.last_capped == [False, True] and judge.stats()["capped"] == 1


def test_an_appended_text_that_lowers_the_score_keeps_the_lower_one():
    judge, _ = judge_with(lambda prompt, _id=None: 1 if "sorry" in prompt else 6)
    assert judge([sample(ANSWER + "\nsorry, I am not sure")]) == pytest.approx([1 / 9])
    assert judge.last_capped == [False]


def test_a_rise_within_the_threshold_is_kept():
    judge, _ = judge_with(lambda prompt, _id=None: 3 if "excellent" in prompt else 2, differential_threshold=0.2)
    assert judge([sample(ANSWER + "\nexcellent")]) == pytest.approx([3 / 9])


def test_an_answer_that_ends_at_its_answer_costs_no_extra_reading():
    judge, model = judge_with(praise_lover)
    at_load = len(model.prompts)
    judge([sample(ANSWER), sample(ANSWER + ".\n", group=1), sample("<answer>45</answer>", group=2)])
    assert len(model.prompts) - at_load == 3 and judge.stats()["core_readings"] == 0


def test_the_core_reading_is_the_answers_own_prompt_and_shares_the_prefix():
    judge, model = judge_with(praise_lover)
    at_load = len(model.prompts)
    judge([sample(ANSWER + "\nAn excellent answer.")])
    full, core = model.prompts[at_load:]
    assert [text for _, text in BLOCK.findall(core)] == [ANSWER]
    shared = len(next(i for i, (a, b) in enumerate(zip(full, core)) if a != b) * "x")
    assert full[:shared].endswith('Response to grade:\n<response key="')  # everything before the response
    judge([sample(ANSWER)])
    assert len(model.prompts) - at_load == 2  # the answer alone was already read: a cache hit


def test_off_and_answerless_tasks_read_only_the_response():
    off, model = judge_with(praise_lover, differential_threshold=None)
    assert off([sample(ANSWER + "\nexcellent")]) == pytest.approx([1.0])
    judge, _ = judge_with(praise_lover)
    # A task without a numeric reference (an agent transcript, an open question) has no answer span.
    assert judge([sample(ANSWER + "\nexcellent", reference=None)]) == pytest.approx([1.0])
    assert judge([sample("No idea, but excellent")]) == pytest.approx([1.0])


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=80), st.text(alphabet="abc", min_size=1, max_size=4), st.sampled_from(["pointwise", "group"]))
def test_no_suffix_raises_a_reward_whatever_the_judge_makes_of_it(suffix, salt, mode):
    def any_judge(prompt, response_id=None):
        return hashed(prompt + str(response_id), salt=salt)

    judge, _ = judge_with(any_judge, mode=mode)
    others = ["9 * 5 = 45, so <answer>45</answer>", "<answer>40</answer>"]
    clean = judge([sample(text) for text in [ANSWER, *others]])[0]
    attacked = judge([sample(text) for text in [ANSWER + "\n" + suffix, *others]])[0]
    assert attacked <= clean + 1e-9


def positional(base: dict[str, int], bias: int = 3):
    """A group judge swayed by place: a response scores its base plus `bias` for standing first, less after."""

    def score_of(prompt: str, response_id: str | None) -> int:
        if response_id is None:  # the load probe's pointwise prompt
            return 5
        blocks = dict(BLOCK.findall(prompt))
        position = int(response_id) - 1
        return max(0, min(9, base.get(blocks[response_id], 5) + bias - 2 * bias * position // max(len(blocks) - 1, 1)))

    return score_of


def test_the_order_and_its_reversal_cancel_a_bias_along_the_list():
    base = {"<answer>45</answer>": 5, "<answer>40</answer>": 4, "<answer>41</answer>": 4, "<answer>42</answer>": 3}
    runs = []
    for seed in range(8):
        model = ScoreModel(positional(base))
        spec = JudgeSpec(model="m", mode="group", scoring="probabilities", injection_guard="off")
        runs.append(Judge(spec, model, seed=seed)([sample(text) for text in base]))
    for position in range(len(base)):
        assert statistics.pstdev(run[position] for run in runs) == pytest.approx(0.0, abs=1e-9)
    assert runs[0] == pytest.approx([value / 9 for value in base.values()])


def test_near_copies_are_one_response_with_one_score():
    model = ScoreModel(positional({"9*5=45, so <answer>45</answer>": 6, "<answer>40</answer>": 2}, bias=0))
    spec = JudgeSpec(model="m", mode="group", scoring="probabilities", injection_guard="off")
    judge = Judge(spec, model)
    at_load = len(model.prompts)
    texts = ["9*5=45, so <answer>45</answer>", "9 * 5 = 45, so <answer>45</answer> ", "<answer>40</answer>"]
    scores = judge([sample(text) for text in texts])
    assert scores[0] == scores[1] == pytest.approx(6 / 9)
    assert all(len(BLOCK.findall(prompt)) == 2 for prompt in model.prompts[at_load:])
