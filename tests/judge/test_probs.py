"""Expected scores from next-token distributions, and the harness's quality metrics, by hand-worked examples."""

from __future__ import annotations

import math

import pytest

from appliance.judge.harness import LabelledSetError, auc, batches, load_rows, shipped_set_path, spearman
from appliance.judge.probs import read_score

SCALE = [str(v) for v in range(10)]


def logprobs(probabilities: dict[str, float]) -> dict[str, float]:
    return {v: math.log(probabilities[v]) if probabilities.get(v) else -math.inf for v in SCALE}


def test_expected_score_is_the_mean_of_the_renormalised_distribution():
    # 0.6 on "9", 0.2 on "0", 0.1 on "3": mass 0.9, expected (0.6*9 + 0.1*3) / 0.9 = 6.333 -> /9 = 0.7037
    reading = read_score(logprobs({"9": 0.6, "0": 0.2, "3": 0.1}), 9, min_mass=0.5)
    assert reading.ok and reading.mass == pytest.approx(0.9)
    assert reading.score == pytest.approx((0.6 * 9 + 0.1 * 3) / 0.9 / 9)
    assert list(reading.distribution) == ["9", "0", "3"]
    assert reading.distribution["9"] == pytest.approx(0.6667, abs=1e-4)


def test_too_little_mass_on_score_tokens_is_a_failure_not_a_score():
    reading = read_score(logprobs({"7": 0.2, "1": 0.1}), 9, min_mass=0.5)
    assert not reading.ok and reading.score is None
    assert "0.300 is below judge.min_score_mass 0.5" in reading.error
    assert not read_score(logprobs({}), 9, min_mass=0.5).ok


def test_certain_extremes_map_to_0_and_1():
    assert read_score(logprobs({"9": 1.0}), 9, 0.5).score == pytest.approx(1.0)
    assert read_score(logprobs({"0": 1.0}), 9, 0.5).score == pytest.approx(0.0)


def test_auc_counts_ties_half_and_needs_both_classes():
    assert auc([0.9, 0.8, 0.1, 0.2], [1, 1, 0, 0]) == 1.0
    assert auc([0.1, 0.2, 0.9, 0.8], [1, 1, 0, 0]) == 0.0
    assert auc([0.5, 0.5, 0.5], [1, 0, 0]) == 0.5
    assert auc([0.7, 0.4, 0.4, 0.1], [1, 1, 0, 0]) == pytest.approx((1 + 1 + 0.5 + 1) / 4)
    assert auc([0.3, 0.4], [1, 1]) is None


def test_spearman_uses_average_ranks():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 1, 1], [1, 2, 3]) is None


def test_batches_keep_a_questions_rows_together(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text(
        "".join(
            f'{{"question": "q{i // 3}", "reference": "1", "response": "r{i}", "label": {i % 2}}}\n' for i in range(9)
        )
    )
    rows = load_rows(path)
    assert batches(rows, 4) == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    assert batches(rows, 6) == [[0, 1, 2, 3, 4, 5], [6, 7, 8]]


def test_a_bad_row_is_one_error_naming_file_line_and_field(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"question": "q", "response": "r", "label": 1}\n{"question": "q", "response": 5, "label": 1}\n')
    with pytest.raises(LabelledSetError, match=r"rows.jsonl:2: 'response' must be a string"):
        load_rows(path)


def test_the_shipped_set_has_both_labels_on_both_tasks_and_two_answers_per_question():
    rows = load_rows(shipped_set_path())
    assert len(rows) == 200
    assert {row.task for row in rows} == {"multiply", "gsm8k"}
    assert {row.label for row in rows} == {0.0, 1.0}
    questions = {}
    for row in rows:
        questions.setdefault(row.question, []).append(row)
    assert all(len(members) == 2 for members in questions.values())
    from appliance.rewards.rules import correctness

    assert all(row.label == correctness(row.question, row.response, row.reference, {}) for row in rows)
