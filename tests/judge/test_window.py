"""Judge prompts longer than the judge's window are cut from the middle and the cut recorded; none crashes a step."""

from __future__ import annotations

import json

import pytest

from appliance.config.schema import JudgeSpec
from appliance.judge import Judge
from appliance.judge.prompts import group_messages
from appliance.judge.window import BYTES_PER_TOKEN, PREFILL_TOKENS, cut_middle, fit_responses
from appliance.rewards.registry import RewardSample
from test_differential import ScoreModel


def estimate(text: str) -> int:
    return -(-len(text.encode()) // BYTES_PER_TOKEN)


def test_cut_middle_keeps_both_ends_and_says_how_much_went():
    text = "START " + "x" * 1000 + " END"
    cut = cut_middle(text, 100)
    assert cut.startswith("START") and cut.endswith("END") and "[... 910 characters cut" in cut
    assert cut_middle("short", 100) == "short"


def test_the_longest_responses_are_cut_first():
    responses = ["a" * 60, "b" * 30_000, "c" * 9_000]
    fitted, cut = fit_responses(lambda texts: "frame " * 50 + "".join(texts), responses, 2_000, estimate)
    assert cut.fits and cut.tokens_after <= 2_000 < cut.tokens_before
    assert fitted[0] == responses[0] and cut.chars_cut[0] == 0 and cut.chars_cut[1] > cut.chars_cut[2] > 0
    assert fit_responses(lambda texts: "".join(texts), ["ok"], 2_000, estimate) == (["ok"], None)


def test_a_frame_longer_than_the_budget_cannot_fit():
    fitted, cut = fit_responses(lambda texts: "q" * 30_000 + "".join(texts), ["r" * 5_000], 1_000, estimate)
    assert not cut.fits and len(fitted[0]) < 300


@pytest.mark.parametrize("mode", ["pointwise", "group"])
def test_a_transcript_longer_than_the_window_is_cut_recorded_and_scored(scripted_engine, tmp_path, mode):
    answer = "9}" if mode == "pointwise" else '9, "explanation": "x"}, {"id": "2", "score": 1, "explanation": "y"}]}'
    engine = scripted_engine(lambda prompt: answer)
    log = tmp_path / "judge.jsonl"
    judge = Judge(JudgeSpec(model="m", mode=mode, max_prompt_tokens=1_500, max_new_tokens=40), engine, log)
    transcript = "TURN-1 " + "tool output line\n" * 5_000 + " FINAL <answer>42</answer>"
    scores = judge([RewardSample("What is 6 x 7?", transcript, "42", 0), RewardSample("What is 6 x 7?", "41", "42", 0)])
    (prompts, sampling) = engine.calls[0]
    assert all(estimate(p) + sampling.max_new_tokens <= 1_500 for p in prompts)
    assert "TURN-1" in prompts[0] and "FINAL <answer>42</answer>" in prompts[0] and "characters cut" in prompts[0]
    assert judge.stats()["prompts_cut"] >= 1 and not any(judge.last_failed) and len(scores) == 2
    cuts = [json.loads(line)["cut"] for line in log.read_text().splitlines()]
    assert any(c and c["fits"] and c["tokens_before"] > 1_500 >= c["tokens_after"] for c in cuts)


def test_a_question_longer_than_the_window_is_a_recorded_failure_not_a_crash(scripted_engine, tmp_path):
    engine = scripted_engine(lambda prompt: "9}")
    log = tmp_path / "judge.jsonl"
    judge = Judge(JudgeSpec(model="m", max_prompt_tokens=1_500, on_failure="minimum"), engine, log)
    scores = judge([RewardSample("Q" * 20_000, "42", "42", 0), RewardSample("Short?", "42", "42", 1)])
    assert scores == [0.0, pytest.approx(0.9)] and judge.last_failed == [True, False]
    assert len(engine.calls[0][0]) == 1  # the prompt that cannot fit is never sent
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert sorted(r["outcome"] for r in records) == ["ok", "too_long"]
    assert judge.stats()["prompts_too_long"] == 1 and judge.outcomes["parse_error"] == 1


def test_a_groups_anchor_lines_stay_inside_the_window():
    # Answers of 60 digits make the anchored opening long (about 70 tokens). A group whose chat alone just fits
    # the window must still be cut, so that the opening the score is read after fits too.
    engine = ScoreModel(lambda prompt, _id: 5)  # no tokenizer: the window counts bytes
    spec = JudgeSpec(model="m", mode="group", scoring="probabilities", max_prompt_tokens=1_500, injection_guard="off")
    judge = Judge(spec, engine)
    at_load = len(engine.prompts)
    big, other = "7" * 60, "8" * 60
    short = f"<answer>{other}</answer>"

    def chat_tokens(transcript: str) -> int:
        return estimate(
            engine.render_chat(group_messages("What is it?", big, [transcript, short], None, "probabilities"))
        )

    answer = f"<answer>{big}</answer>"
    lines = (1_470 - chat_tokens(answer)) * BYTES_PER_TOKEN // len("working line\n")
    transcript = "working line\n" * lines + answer
    assert 1_400 < chat_tokens(transcript) <= 1_500 - 1 - PREFILL_TOKENS  # it fits the window without the anchor
    judge([RewardSample("What is it?", transcript, big, 0), RewardSample("What is it?", short, big, 0)])
    sent = engine.prompts[at_load:]
    assert sent and all(f'"answer": "{big}", "score": 9}}' in prompt for prompt in sent)
    assert max(estimate(prompt) for prompt in sent) + 1 <= 1_500
    assert judge.stats()["prompts_cut"] >= 1 and not any(judge.last_failed)
