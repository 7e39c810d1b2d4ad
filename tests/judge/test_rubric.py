"""A rubric naming a score outside the judge's scale is a configuration error, at check and at load."""

from __future__ import annotations

import pytest

from appliance.config.schema import JudgeSpec
from appliance.judge import Judge
from appliance.judge.rubric import RubricScaleError, check_rubric_scale, scores_named

OUTSIDE_PROBABILITY = [
    "Give 10 for a perfect answer.",
    "A correct answer scores 10, a wrong one 0.",
    "Rate it 7/10 if partly right.",
    "Grade from 1 to 10.",
    "Use a 10-point scale.",
    "On a scale of 0-10, judge correctness.",
    "A perfect answer gets a 10.",
    "Award 10 points for completeness.",
    "Scores: 0 (wrong) ... 10 (perfect)",
    "Use a ten-point scale.",
    "Judge on a scale from zero to ten.",
    "Mark it out of ten.",
    "A perfect answer: 10 \u2014 anything else less.",
    "Perfect answers get \uff11\uff10.",  # fullwidth digits
    "Give a perfect answer te\u200bn.",  # a zero-width space inside the word
    "Perfect answers get \u2793.",  # a dingbat ten the fold once left alone
    "Perfect answers get \u00b9\u2070.",  # superscript digits
]
INSIDE = [
    "Give 9 for a perfect answer and 0 for a wrong one.",
    "The answer has 3 digits. A correct one scores 9.",
    "Score from zero to nine.",
    "",
]


@pytest.mark.parametrize("rubric", OUTSIDE_PROBABILITY)
def test_any_number_above_nine_is_refused_for_probability_scoring(rubric):
    with pytest.raises(RubricScaleError, match=r"names the number 10 .* scores 0-9.*scoring: generate"):
        check_rubric_scale(rubric, "probabilities")
    with pytest.raises(RubricScaleError):
        check_rubric_scale(rubric, "auto")
    check_rubric_scale(rubric, "generate")  # 0-10 holds them


def test_a_dozen_is_a_number_above_nine():
    with pytest.raises(RubricScaleError, match="names the number 12"):
        check_rubric_scale("Use a scale from zero to a dozen.", "probabilities")


def test_a_number_that_is_no_score_passes_when_the_job_lists_it():
    rubric = "Answers over 100 words are too long; score 0 to 9."
    with pytest.raises(RubricScaleError, match=r"names the number 100 .* list it in judge.rubric_numbers"):
        check_rubric_scale(rubric, "probabilities")
    check_rubric_scale(rubric, "probabilities", allowed=[100])
    with pytest.raises(RubricScaleError, match="names the number 20"):
        check_rubric_scale(rubric + " Use a twenty-point scale.", "probabilities", allowed=[100])


@pytest.mark.parametrize("rubric", INSIDE)
def test_rubrics_inside_the_scale_pass(rubric):
    check_rubric_scale(rubric, "probabilities")


def test_generate_refuses_a_hundred_point_rubric():
    with pytest.raises(RubricScaleError, match="names the score 100 .* reads scores 0-10: write"):
        check_rubric_scale("Score out of 100: give 100 to a perfect answer.", "generate")
    assert (100, "give 100") in scores_named("give 100 to a perfect answer")


def test_the_judge_refuses_at_load(scripted_engine):
    engine = scripted_engine(lambda prompt: "9}")
    with pytest.raises(RubricScaleError, match="judge.rubric"):
        Judge(JudgeSpec(model="m", scoring="generate", rubric="Give 100 for a perfect answer."), engine)


def test_job_check_names_the_rubric_key(tmp_path):
    from appliance.job_checks import check_job_file

    job = tmp_path / "job.yaml"
    job.write_text(
        "name: j\nstudent: {model: smollm2-135m-instruct}\ntask: {dataset: 'builtin:multiply'}\n"
        "rewards: [{name: judge}]\njudge: {model: smollm2-135m-instruct, rubric: 'Scores: 0 (wrong) ... 10 (perfect)'}\n"
    )
    errors = check_job_file(job, tmp_path / "data", check_models=False)
    assert any("judge.rubric names the number 10" in str(error) and "rubric" in str(error) for error in errors)
    allowed = job.read_text().replace("judge: {", "judge: {rubric_numbers: [10], ")
    job.write_text(allowed)
    assert check_job_file(job, tmp_path / "data", check_models=False)[1] == []
