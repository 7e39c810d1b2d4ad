"""Each rule reward on hand-made completions, with the exact value it must give."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from appliance.rewards.extract import answer_core
from appliance.rewards.rules import (
    answer_format,
    correctness,
    format_compliant,
    int_answer,
    length,
    soft_format,
    strict_format,
    xmlcount,
)

PERFECT = "<reasoning>\n48/2 = 24 in May, 48 + 24 = 72.\n</reasoning>\n<answer>\n72\n</answer>\n"
PERFECT_NO_FINAL_NEWLINE = PERFECT.rstrip("\n")
ONE_LINE = "<reasoning>48 + 24 = 72</reasoning><answer>72</answer>"
PROSE = "She sold 48 + 24 = 72 clips. The answer is 72."


def call(rule, completion, reference="72", **params):
    return rule("How many clips?", completion, reference, {}, **params)


@pytest.mark.parametrize(
    ("completion", "reference", "expected"),
    [
        (PERFECT, "72", 1.0),
        (PROSE, "72", 1.0),
        (PERFECT, "Natalia sold 24 clips in May.\n#### 72", 1.0),
        ("<answer>$1,234</answer>", "1234", 1.0),
        ("<answer>3.50</answer>", "3.5", 1.0),
        ("<answer>71</answer>", "72", 0.0),
        ("I don't know", "72", 0.0),
        (PERFECT, None, 0.0),
    ],
)
def test_correctness(completion, reference, expected):
    assert call(correctness, completion, reference) == expected


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        (PERFECT, 1.0),
        (PERFECT_NO_FINAL_NEWLINE, 1.0),
        (PERFECT.replace("48/2", "48/2\nthen\n"), 1.0),  # multi-line reasoning
        (ONE_LINE, 0.0),  # tags not on their own lines
        ("Sure! " + PERFECT, 0.0),  # text before the layout
        (PERFECT + "Anything else?", 0.0),  # text after </answer>
        ("<answer>\n72\n</answer>\n", 0.0),  # no reasoning
    ],
)
def test_strict_format(completion, expected):
    assert call(strict_format, completion) == expected


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        (PERFECT, 1.0),
        (ONE_LINE, 1.0),
        ("Sure! " + ONE_LINE + " bye", 1.0),
        ("<answer>72</answer><reasoning>because</reasoning>", 0.0),  # wrong order
        ("<reasoning>because</reasoning>", 0.0),
        (PROSE, 0.0),
    ],
)
def test_soft_format(completion, expected):
    assert call(soft_format, completion) == expected


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("<answer>42</answer>", 1.0),
        ("6 * 7 is 42.\n<answer> 42 </answer>\n", 1.0),
        ("<answer>-1,234.5</answer>", 1.0),
        ("<answer>42</answer> Hope that helps", 0.0),  # text after the block
        ("<answer>42</answer><answer>42</answer>", 0.0),  # two blocks
        ("<answer>6 * 7 = 42</answer>", 0.0),  # more than a number
        ("<answer>42 apples</answer>", 0.0),
        ("<answer></answer>", 0.0),
        ("42", 0.0),
    ],
)
def test_answer_format(completion, expected):
    assert call(answer_format, completion) == expected


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("<answer>72</answer>", 0.5),
        ("<answer>72.0</answer>", 0.5),
        ("<answer>1,000</answer>", 0.5),
        ("<answer>3.5</answer>", 0.0),
        ("nothing numeric", 0.0),
    ],
)
def test_int_answer(completion, expected):
    assert call(int_answer, completion) == expected


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        (PERFECT, 0.5),
        (PERFECT_NO_FINAL_NEWLINE, 0.5),
        (PERFECT + "Bye!", 0.5 - 0.004),  # 4 trailing characters
        (ONE_LINE, 0.0),  # no tag on its own line
        ("<reasoning>\nwhy\n</reasoning>\n", 0.25),
        ("<reasoning>\nwhy\n</reasoning>\n<answer>\n72", 0.375),  # unclosed answer
        (PERFECT + PERFECT, 0.0),  # every tag twice
    ],
)
def test_xmlcount(completion, expected):
    assert call(xmlcount, completion) == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize(
    ("characters", "expected"),
    [(0, 0.0), (40, 0.0), (80, 0.0), (120, -0.5), (160, -1.0), (400, -1.0)],
)
def test_length_counts_four_characters_per_token(characters, expected):
    assert call(length, "x" * characters, target=20) == pytest.approx(expected)


def test_length_prefers_the_real_token_count():
    assert length("q", "short text", "1", {"completion_tokens": 30}, target=20) == pytest.approx(-0.5)


def test_length_rejects_a_non_positive_target():
    with pytest.raises(ValueError, match="target"):
        call(length, "x", target=0)


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("<answer>72</answer>", True),
        ("work...\n<answer>\n$18 dollars\n</answer>", True),
        ("<answer>I am not sure</answer>", False),
        ("The answer is 72.", False),
        ("<answer>72", False),
    ],
)
def test_format_compliant(completion, expected):
    assert format_compliant(completion) is expected


def test_a_10000_digit_sample_scores_0_and_the_step_goes_on():
    from appliance.config.schema import RewardSpec
    from appliance.rewards.registry import RewardSample, build_rewards, score_samples

    specs = [RewardSpec(name=name) for name in ("correctness", "int", "answer_format", "strict_format", "xmlcount")]
    rewards = build_rewards(specs, Path("."))
    degenerate = RewardSample("How many?", "3" * 10_000, "72")
    honest = RewardSample("How many?", "<answer>72</answer>", "72")
    scores = score_samples(rewards, [degenerate, honest])
    assert scores.per_function["correctness"] == [0.0, 1.0]
    assert scores.per_function["int"] == [0.0, 0.5]


NUMBERISH = st.text(alphabet="0123456789.,-/ =!\u2260<>answer\\{}fracboxed#not \n", max_size=400)


@settings(max_examples=300, deadline=None)
@given(st.one_of(NUMBERISH, st.text(max_size=300), st.integers(0, 20_000).map(lambda n: "9" * n)))
def test_no_rule_raises_on_what_a_sample_says(completion):
    for rule in (correctness, int_answer, answer_format, strict_format, soft_format, xmlcount):
        value = rule("q", completion, "72", {})
        assert value == value  # a number, not NaN
    assert isinstance(format_compliant(completion), bool)


@pytest.mark.parametrize(
    ("completion", "reference"),
    [
        ("<answer>4\u00b2</answer>", "42"),  # 4 squared is 16, not 42
        ("The answer is 2\u2074", "24"),  # 2 to the 4th
        ("The answer is 3\u00bd", "15.5"),  # three and a half, not 31/2
        ("<answer>\u2460\u2461</answer>", "12"),  # two circled numbers
    ],
)
def test_a_styled_digit_earns_no_credit_for_the_number_it_would_join(completion, reference):
    assert correctness("q", completion, reference, {}) == 0.0


def test_a_sample_of_unclosed_markup_is_read_in_linear_time():
    """Thousands of unclosed `\\boxed{` or `<answer>` (a degenerate sample) cost their length, not its square."""
    import time

    for degenerate in ("\\boxed{" * 8_000, "<answer>" * 8_000 + "</answer>x<answer>" * 800):
        started = time.perf_counter()
        for rule in (correctness, int_answer, answer_format):
            rule("q", degenerate, "72", {})
        answer_core(degenerate)
        assert time.perf_counter() - started < 5.0
