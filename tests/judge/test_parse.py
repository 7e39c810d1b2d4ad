"""Raw judge outputs through the tolerant parsers: each gives a score in 0..1 or a named error."""

from __future__ import annotations

import pytest

from appliance.judge.parse import JudgeOutputError, find_json_values, parse_group, parse_pointwise

# (case id, raw model output, expected score in 0..1 or the error message fragment)
POINTWISE_CASES = [
    ("well-formed", '{"score": 7, "reason": "mostly right"}', 0.7),
    ("top score", '{"score": 10, "reason": "perfect"}', 1.0),
    ("zero", '{"score": 0, "reason": "wrong"}', 0.0),
    ("fractional", '{"score": 7.5, "reason": "ok"}', 0.75),
    ("json fence", '```json\n{"score": 8, "reason": "good"}\n```', 0.8),
    ("bare fence", '```\n{"score": 3, "reason": "weak"}\n```', 0.3),
    ("prose around", 'Here is my verdict: {"score": 6, "reason": "fine"} I hope this helps!', 0.6),
    ("prose with apostrophe first", 'Let\'s see. It\'s fine.\n{"score": 9, "reason": "clear"}', 0.9),
    ("single quotes", "{'score': 4, 'reason': 'it is partly right'}", 0.4),
    ("trailing comma", '{"score": 5, "reason": "half",}', 0.5),
    ("bare keys", "{score: 2, reason: wrong answer}", 0.2),
    ("score as string", '{"score": "7", "reason": "ok"}', 0.7),
    ("score as n/10", '{"score": "7/10", "reason": "ok"}', 0.7),
    ("capitalised key", '{"Score": 1, "Reason": "bad"}', 0.1),
    ("nested object", '{"verdict": {"score": 8, "reason": "good"}}', 0.8),
    ("echoed template before answer", 'Format: {"score": <0-10>, "reason": "..."}\n{"score": 6, "reason": "ok"}', 0.6),
    ("multi-line reason with braces", '{"score": 8, "reason": "uses {x} correctly"}', 0.8),
    ("score 15 out of range", '{"score": 15, "reason": "great"}', "outside 0 to 10"),
    ("score -1 out of range", '{"score": -1, "reason": "awful"}', "outside 0 to 10"),
    ("NaN", '{"score": NaN, "reason": "?"}', "must be a number"),
    ("NaN string", '{"score": "nan", "reason": "?"}', "must be a number"),
    ("boolean", '{"score": true, "reason": "?"}', "must be a number"),
    ("word score", '{"score": "high", "reason": "?"}', "must be a number"),
    ("null score", '{"score": null}', "must be a number"),
    ("missing score", '{"reason": "no score given"}', 'no "score" key'),
    ("truncated", '{"score": 7, "reason": "the answer is mostly', "cut off or malformed"),
    ("truncated in fence", '```json\n{"score": 7, "rea', "cut off or malformed"),
    ("empty", "", "empty"),
    ("whitespace only", "  \n ", "empty"),
    ("plain prose", "The response is correct, I would give it a 9.", "no JSON object"),
    ("list not object", "[7, 8]", 'no "score" key'),
]


@pytest.mark.parametrize(
    "raw, expected", [case[1:] for case in POINTWISE_CASES], ids=[case[0] for case in POINTWISE_CASES]
)
def test_pointwise_outputs(raw, expected):
    if isinstance(expected, float):
        assert parse_pointwise(raw).score == pytest.approx(expected)
    else:
        with pytest.raises(JudgeOutputError, match=expected):
            parse_pointwise(raw)


def test_pointwise_keeps_the_reason():
    assert parse_pointwise('```json\n{"score": 7, "reason": "mostly right"}\n```').reason == "mostly right"


IDS = ["1", "2", "3"]

GROUP_CASES = [
    (
        "well-formed",
        '{"scores": [{"id": "1", "score": 7, "explanation": "a"}, {"id": "2", "score": 10, "explanation": "b"},'
        ' {"id": "3", "score": 0, "explanation": "c"}]}',
        [0.7, 1.0, 0.0],
    ),
    (
        "integer ids, out of order",
        '{"scores": [{"id": 3, "score": 1}, {"id": 1, "score": 2}, {"id": 2, "score": 3}]}',
        [0.2, 0.3, 0.1],
    ),
    (
        "bare list in a fence with prose",
        'Scores:\n```json\n[{"id": "1", "score": 5}, {"id": "2", "score": 6}, {"id": "3", "score": 7},]\n```\nDone.',
        [0.5, 0.6, 0.7],
    ),
    ("mapping of id to score", '{"1": 4, "2": {"score": 8, "explanation": "x"}, "3": 9}', [0.4, 0.8, 0.9]),
    (
        "single quotes and response_id",
        "{'scores': [{'response_id': '1', 'score': 2}, {'response_id': '2', 'score': 2}, {'response_id': '3', 'score': 2}]}",
        [0.2, 0.2, 0.2],
    ),
    ("missing id", '{"scores": [{"id": "1", "score": 7}, {"id": "2", "score": 5}]}', "missing ids: 3"),
    (
        "duplicated id",
        '{"scores": [{"id": "1", "score": 7}, {"id": "1", "score": 5}, {"id": "2", "score": 5}, {"id": "3", "score": 1}]}',
        "more than once: 1",
    ),
    (
        "extra id",
        '{"scores": [{"id": "1", "score": 7}, {"id": "2", "score": 5}, {"id": "3", "score": 1}, {"id": "4", "score": 1}]}',
        "unknown ids: 4",
    ),
    (
        "score 15",
        '{"scores": [{"id": "1", "score": 15}, {"id": "2", "score": 5}, {"id": "3", "score": 1}]}',
        "score of id 1 15 is outside",
    ),
    (
        "NaN score",
        '{"scores": [{"id": "1", "score": NaN}, {"id": "2", "score": 5}, {"id": "3", "score": 1}]}',
        "score of id 1 must be a number",
    ),
    ("entries without ids", '{"scores": [{"score": 1}, {"score": 2}, {"score": 3}]}', 'no "scores" list'),
    ("truncated", '{"scores": [{"id": "1", "score": 7}, {"id": "2", "sc', "cut off or malformed"),
    ("empty", "", "empty"),
    ("pointwise answer instead", '{"score": 7, "reason": "one score for all"}', 'no "scores" list'),
]


@pytest.mark.parametrize("raw, expected", [case[1:] for case in GROUP_CASES], ids=[case[0] for case in GROUP_CASES])
def test_group_outputs(raw, expected):
    if isinstance(expected, list):
        verdicts = parse_group(raw, IDS)
        assert list(verdicts) == IDS
        assert [verdicts[i].score for i in IDS] == pytest.approx(expected)
    else:
        with pytest.raises(JudgeOutputError, match=expected):
            parse_group(raw, IDS)


def test_group_keeps_explanations_by_id():
    verdicts = parse_group(
        '{"scores": [{"id": "2", "score": 1, "explanation": "wrong"}, {"id": "1", "score": 9, '
        '"explanation": "right"}]}',
        ["1", "2"],
    )
    assert verdicts["1"].reason == "right"
    assert verdicts["2"].reason == "wrong"


def test_find_json_values_prefers_fenced_blocks_and_skips_broken_ones():
    text = 'junk {"a": 1 and more\n```json\n{"b": 2}\n```\nthen {"c": 3}'
    assert list(find_json_values(text))[:2] == [{"b": 2}, {"c": 3}]


def _alias_bomb(levels: int) -> str:
    """A YAML flow mapping whose score is an alias that expands to 9**levels items; a few hundred bytes."""
    rows = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    rows += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, levels)]
    return "{" + ", ".join(rows) + f", score: *a{levels - 1}}}"


def test_an_alias_bomb_in_a_judge_answer_is_not_expanded():
    import time

    answer = _alias_bomb(levels=7)  # 9**7 = 4.8 million nodes if expanded
    assert len(answer) < 500
    started = time.monotonic()
    with pytest.raises(JudgeOutputError) as caught:
        parse_pointwise(answer)
    assert time.monotonic() - started < 1.0
    assert len(str(caught.value)) < 200  # it goes into the retry prompt and judge.jsonl


def test_a_bad_score_error_is_short_whatever_the_answer_holds():
    with pytest.raises(JudgeOutputError) as caught:
        parse_pointwise('{"score": "' + "9" * 100 + "x" * 100_000 + '", "reason": "r"}')
    assert len(str(caught.value)) < 200
    with pytest.raises(JudgeOutputError) as caught:
        parse_pointwise('{"score": [' + ", ".join(["1"] * 50_000) + '], "reason": "r"}')
    assert len(str(caught.value)) < 200
