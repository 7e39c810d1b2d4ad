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
]
INSIDE = [
    "Give 9 for a perfect answer and 0 for a wrong one.",
    "Answers over 100 words are too long; score 0 to 9.",
    "The answer has 3 digits. A correct one scores 9.",
    "",
]


@pytest.mark.parametrize("rubric", OUTSIDE_PROBABILITY)
def test_scores_above_nine_are_refused_for_probability_scoring(rubric):
    with pytest.raises(RubricScaleError, match=r"names the score 10 .* reads scores 0-9.*scoring: generate"):
        check_rubric_scale(rubric, "probabilities")
    with pytest.raises(RubricScaleError):
        check_rubric_scale(rubric, "auto")
    check_rubric_scale(rubric, "generate")  # 0-10 holds them


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
        "rewards: [{name: judge}]\njudge: {model: smollm2-135m-instruct, rubric: 'A perfect answer scores 10.'}\n"
    )
    errors = check_job_file(job, tmp_path / "data", check_models=False)
    assert any("judge.rubric names the score 10" in str(error) and "rubric" in str(error) for error in errors)
