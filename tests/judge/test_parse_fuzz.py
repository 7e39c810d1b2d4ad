"""The reasoned-mode parser never raises anything but JudgeOutputError, and its cost is linear in the text.

Hypothesis feeds random and hostile strings up to 100 kB. The hostile set holds
the inputs that used to escape the parser or take quadratic time: a YAML date
that is not a date, a number of thousands of digits, nesting thousands deep,
and long runs of unclosed brackets and code fences.
"""

from __future__ import annotations

import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from appliance.judge.parse import JudgeOutputError, Verdict, find_json_values, parse_group, parse_pointwise

IDS = ["1", "2", "3"]
BIG = 100_000

HOSTILE = {
    "yaml date out of range": "{score: 2024-13-45}",
    "yaml date": "{'score': 2024-01-01, 'reason': x}",
    "thousands of digits": '{"score": ' + "9" * 5000 + "}",
    "thousands of digits, yaml": "{score: " + "9" * 5000 + "}",
    "deep nesting": "[" * 50_000 + "]" * 50_000,
    "deep nesting, unclosed": '{"score": ' + "[" * BIG,
    "deep objects": '{"a":' * 20_000 + "1" + "}" * 20_000,
    "unclosed braces": "{" * BIG,
    "unclosed fences": "```" * (BIG // 3),
    "fences and braces": "```json\n{" * (BIG // 9),
    "quotes": '{"' * (BIG // 2),
    "single quotes": "{'" * (BIG // 2),
    "backslashes": '{"score": "' + "\\" * BIG,
    "many small objects": '{"x": 1} ' * (BIG // 9),
    "alternating closers": "{]" * (BIG // 2),
    "nan and inf": '{"score": NaN} {"score": Infinity} {"score": -1e999}',
    "yaml anchors": "{a: &a [1,2], b: *a, score: *a}",
    "yaml tags": "{score: !!python/object:os.system ls}",
    "null bytes": '{"score": 5\x00}',
    "lone surrogate": '{"score": "\ud800"}',
}


def parse_both(text: str) -> None:
    for parse in (parse_pointwise, lambda t: parse_group(t, IDS)):
        try:
            result = parse(text)
        except JudgeOutputError:
            continue
        assert isinstance(result, (Verdict, dict))


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_outputs_raise_only_judge_output_errors_quickly(name):
    text = HOSTILE[name]
    started = time.perf_counter()
    parse_both(text)
    list(find_json_values(text))
    # A quadratic scan of 100 kB is ~10^10 steps (minutes); linear is well under a second even on a loaded box.
    assert time.perf_counter() - started < 10.0, name


def test_cost_grows_linearly_with_the_text():
    def seconds(size: int) -> float:
        text = "{" * size + '"score": 5}' + "```" * (size // 3)
        started = time.perf_counter()
        parse_both(text)
        return time.perf_counter() - started

    seconds(1000)  # warm up
    small, large = min(seconds(BIG // 4) for _ in range(2)), min(seconds(BIG) for _ in range(2))
    # Four times the text: linear ~4x, quadratic ~16x. 9x leaves room for timer noise.
    assert large < 9 * small + 0.05, (small, large)


json_like = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)
alphabet = st.sampled_from(list("{}[]\"':,\\`\n -0123456789.eE") + ["score", "scores", "id", "```json", "NaN", "null"])


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=2000) | st.lists(alphabet, max_size=3000).map("".join))
def test_random_text_never_escapes_the_parser(text):
    parse_both(text)


@settings(max_examples=100, deadline=None)
@given(json_like, st.text(max_size=50), st.text(max_size=50))
def test_random_json_values_in_prose_never_escape_the_parser(value, before, after):
    import json

    parse_both(before + json.dumps(value) + after)
    parse_both(before + json.dumps({"score": value, "scores": value}) + after)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.large_base_example])
@given(st.integers(min_value=BIG // 2, max_value=BIG), st.sampled_from(list("{[`\"'\\:,")))
def test_long_runs_of_one_character_up_to_100_kb(size, character):
    parse_both(character * size)


def test_a_valid_answer_after_hostile_text_is_still_found():
    text = "```" * 1000 + "{" * 1000 + '\n{"score": 7, "reason": "ok"}'
    assert parse_pointwise("}" * 1000 + '{"score": 7, "reason": "ok"}').score == pytest.approx(0.7)
    with pytest.raises(JudgeOutputError):
        parse_pointwise(text)  # inside an unclosed fence and unclosed braces: not an answer
