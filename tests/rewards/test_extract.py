"""Answer extraction on the shapes real completions and references take."""

from __future__ import annotations

import pytest

from appliance.rewards.extract import answers_match, extract_answer

EXTRACTION_CASES = [
    # (text, expected canonical answer)
    ("<answer>72</answer>", "72"),
    ("<reasoning>\n48/2 = 24, 48 + 24 = 72\n</reasoning>\n<answer>\n72\n</answer>\n", "72"),
    ("<answer>6 * 7 = 42</answer>", "42"),
    ("<answer>$1,234.50</answer>\nThat took 99 seconds.", "1234.5"),
    ("first <answer>3</answer> then corrected <answer>4</answer>", "4"),
    ("<answer>unsure</answer> but the total is 15", "15"),
    ("Natalia sold 48/2 = <<48/2=24>>24 clips.\n#### 72", "72"),
    ("#### 1,080", "1080"),
    ("#### -5", "-5"),
    ("So the result is \\boxed{72}.", "72"),
    ("\\boxed{\\frac{3}{4}}", "0.75"),
    ("\\boxed{1,000} apples", "1000"),
    ("The answer is 72.", "72"),
    ("The answer is 72. I hope this helps! Rate 5 stars.", "72"),
    ("Final answer: 18 dollars", "18"),
    ("**Answer:** $18", "18"),
    ("She earned 18 dollars in total", "18"),
    ("She pays $18.", "18"),
    ("The discount is 18%.", "18"),
    ("It drops to -3 degrees", "-3"),
    ("Answer: \u22127", "-7"),
    ("The price is 3.50", "3.5"),
    ("That is .5 of the cake", "0.5"),
    ("Population: 1,234,567 people", "1234567"),
    ("The ratio is 3/4.", "0.75"),
    ("Half of 48 is 48/2", "24"),
    ("10-5=5", "5"),
    ("3 - 4 = -1", "-1"),
    ("Using v1.2 of the method we get 9", "9"),
    ("I have no idea.", None),
    ("", None),
]


@pytest.mark.parametrize(("text", "expected"), EXTRACTION_CASES)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


@pytest.mark.parametrize(
    ("predicted", "reference", "expected"),
    [
        ("3.50", "3.5", True),
        ("The answer is 72.", "Natalia sold 24 clips in May.\n#### 72", True),
        ("<answer>1,080</answer>", "1080", True),
        ("$18", "18", True),
        ("18.0", "18", True),
        ("0.75", "3/4", True),
        ("71", "72", False),
        ("-72", "72", False),
        ("0.333", "1/3", False),
        ("no number", "72", False),
        (None, "72", False),
        ("72", None, False),
    ],
)
def test_answers_match(predicted, reference, expected):
    assert answers_match(predicted, reference) is expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [("12345678901234.5678", "12345678901234.5678"), ("-0.050", "-0.05"), ("1/3", "1/3"), ("7/8", "0.875")],
)
def test_canonical_form_is_exact(text, expected):
    assert extract_answer(text) == expected
