"""Every bound of the job file holds: each row of the limits table is tried one past its bound, generated job
files never get past the schema unbounded or unclean, and the docs show the schema's own table."""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from appliance.config.job_file import parse_job, read_job
from appliance.config.limits import (
    MAX_INTEGER,
    MAX_JOB_FILE_BYTES,
    MAX_MULTIPLY_PROBLEMS,
    MAX_NUMBER_CHARS,
    Limit,
    limits_table,
    table_text,
)
from appliance.text_rules import escaped, text_problem

REPO = Path(__file__).resolve().parents[2]

ANY_TEXT_OUT = st.text(st.characters(codec=None, categories=None), max_size=40)

BASE = {
    "name": "bounded",
    "student": {"model": "smollm2-135m-instruct", "lora": {"target_modules": ["q_proj"]}},
    "judge": {"model": "judge-model", "rubric": "Score it.", "chat_template_kwargs": {"enable_thinking": False}},
    "task": {
        "dataset": "builtin:multiply",
        "system_prompt": "Answer.",
        "few_shot": [{"question": "What is 2 * 3?", "answer": "6"}],
    },
    "rewards": [{"name": "correctness", "params": {"scale": 1}}],
    "grpo": {"steps": 3},
    "checkpoint": {"best_metric": "reward_mean"},
    "tracking": {"wandb_project": "p"},
}
AGENT = {**BASE, "task": {"environment": "builtin:calculator", "environment_options": {"operand_max": 50}}}
SCHEMA_ROWS = [row for row in limits_table() if not row.key.startswith("(") and " (rows)" not in row.key]
SCHEMA_ROWS = [row for row in SCHEMA_ROWS if ".." not in row.key]


def parts(key: str) -> list:
    """'rewards[].params.*' -> ['rewards', 0, 'params', '*']; a trailing ' (key)' stays a marker."""
    found: list = []
    for piece in key.replace(" (key)", ".(key)").split("."):
        name, lists = piece.rstrip("[]"), piece.count("[]")
        found.append(name)
        found.extend([0] * lists)
    return found


def one_past(row: Limit, data: dict) -> dict:
    """`data` with the key of `row` set one past its upper bound."""
    data = copy.deepcopy(data)
    path = parts(row.key)
    node = data
    for part, following in zip(path, path[1:]):
        if part == "*":
            part = next(iter(node))
        if isinstance(part, int):
            node = node[part]
            continue
        if following == "(key)":
            node[part] = {"k" * (int(row.high) + 1): 1}
            return data
        node = node.setdefault(part, {} if not isinstance(following, int) else [])
    last = path[-1]
    if last == "*":
        last = next(iter(node))
    high = int(row.high)
    make = {
        "integer": lambda: high + 1,
        "number": lambda: float(row.high) * 2 + 1,
        "string": lambda: "x" * (high + 1),
        "list": lambda: [copy.deepcopy((node.get(last) or ["x"])[0])] * (high + 1),
        "mapping": lambda: {f"k{index}": 1 for index in range(high + 1)},
    }
    if isinstance(last, int) and len(node) <= last:  # a list of scalars the base leaves empty
        node.append(None)
    node[last] = make[row.kind]()
    return data


def test_every_number_list_string_and_mapping_of_the_schema_has_an_upper_bound():
    unbounded = [row.key for row in limits_table() if row.high is None]
    assert not unbounded, f"keys without an upper bound: {unbounded}"
    kinds = {row.kind for row in SCHEMA_ROWS}
    assert kinds == {"integer", "number", "string", "list", "mapping", "mapping key"}
    assert len(SCHEMA_ROWS) > 80


@pytest.mark.parametrize("row", SCHEMA_ROWS, ids=lambda row: f"{row.key}:{row.kind}")
def test_one_past_each_bound_is_refused_at_its_key(row):
    base = AGENT if row.key.startswith("task.environment_options") else BASE
    parsed = parse_job(json.dumps(one_past(row, base)), "bounded.yaml")
    assert parsed.spec is None, f"{row.key} one past {row.high} was accepted"
    prefix = row.key.split("[]")[0].split(" (key)")[0].split(".*")[0]
    assert any(error.key.startswith(prefix) for error in parsed.errors), [str(e) for e in parsed.errors]


def test_the_base_jobs_are_valid():
    for base in (BASE, AGENT):
        parsed = parse_job(json.dumps(base), "base.yaml")
        assert parsed.spec is not None, [str(e) for e in parsed.errors]


def test_the_docs_and_the_cli_show_the_schemas_own_table():
    table = table_text(limits_table(), markdown=True)
    assert table in (REPO / "docs" / "limits.md").read_text(), "docs/limits.md: regenerate its table"
    shown = subprocess.run(
        [sys.executable, "-m", "appliance", "config", "check", "--limits"], capture_output=True, text=True, cwd=REPO
    )
    assert shown.returncode == 0, shown.stderr
    assert "grpo.steps" in shown.stdout and "1 .. 1_000_000" in shown.stdout
    assert shown.stdout == table_text(limits_table())


def test_the_file_is_refused_by_its_size_before_it_is_parsed(tmp_path):
    text = "name: big\n" + "#" * MAX_JOB_FILE_BYTES + "\n"
    started = time.monotonic()
    parsed = parse_job(text, "big.yaml")
    assert parsed.data is None and "over the limit of 262144" in parsed.errors[0].message
    sparse = tmp_path / "sparse.yaml"
    with open(sparse, "wb") as handle:  # claims 4 GiB, holds nothing: read_job reads the cap, no more
        handle.truncate(4 * 2**30)
    tracemalloc.start()
    parsed = read_job(sparse)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert "over the limit of 262144 bytes" in parsed.errors[0].message
    assert peak < 4 * MAX_JOB_FILE_BYTES and time.monotonic() - started < 2.0


def test_a_huge_multiply_range_is_counted_never_built():
    text = json.dumps({**BASE, "task": {"operand_min": 0, "operand_max": 20_000}})
    started = time.monotonic()
    parsed = parse_job(text, "wide.yaml")
    assert time.monotonic() - started < 0.5
    [error] = parsed.errors
    assert error.key == "task" and "400040001 multiply problems, over the limit of 250000" in error.message
    width = int(MAX_MULTIPLY_PROBLEMS**0.5)
    assert parse_job(json.dumps({**BASE, "task": {"operand_min": 1, "operand_max": width}}), "x").spec is not None


@pytest.mark.parametrize(
    "where, value",
    [
        (("name",), "a\x1b]2;pwned\x07"),
        (("student", "model"), "m\x00odel"),
        (("judge", "rubric"), "\x1b[2J score"),
        (("task", "system_prompt"), "be terse\x9b"),
        (("task", "few_shot", 0, "answer"), "6\ud800"),
        (("rewards", 0, "params", "k"), "v\x07"),
        (("checkpoint", "best_metric"), "reward_mean\n"),
    ],
)
def test_control_characters_and_lone_surrogates_are_refused_at_their_key(where, value):
    data = copy.deepcopy(BASE)
    node = data
    for part in where[:-1]:
        node = node[part]
    node[where[-1]] = value
    parsed = parse_job(yaml_text(data), "dirty.yaml")
    assert parsed.spec is None
    [error] = parsed.errors
    assert re.search(r"(control character|lone surrogate) \(U\+[0-9A-F]{4}\)", error.message), str(error)
    assert error.key == ".".join(str(p) for p in where).replace(".0", "[0]") and error.line == 1
    assert text_problem(str(error), multiline=True) is None, "the error repeats the character"


def yaml_text(data) -> str:
    """JSON (which is YAML) with every string written out raw, not as a \\u escape (libyaml refuses an escaped
    lone surrogate itself; the raw character is what a request body can carry)."""
    return json.dumps(data, ensure_ascii=False)


def test_a_control_character_in_a_key_is_shown_escaped():
    data = {**BASE, "task": {**BASE["task"], "\x1b]52;c;Y3VybCBldmlsIHwgc2g=\x07": 1}}
    parsed = parse_job(json.dumps(data), "keys.yaml")
    [error] = [e for e in parsed.errors if "unknown key" in e.message]
    assert "\\x1b]52" in error.key and "\x1b" not in str(error)


BIDI_CONTROLS = [chr(code) for code in [*range(0x202A, 0x202F), *range(0x2066, 0x206A)]]


@settings(max_examples=200, deadline=None)
@given(text=ANY_TEXT_OUT, bidi=st.lists(st.sampled_from(BIDI_CONTROLS), max_size=4), multiline=st.booleans())
def test_what_a_terminal_is_shown_reorders_nothing_and_steers_nothing(text, bidi, multiline):
    """Another member's sample text or failure reason with a right-to-left override ("\u202e") showed the rest
    of the line reversed (a name or command other than the one it holds)."""
    shown = escaped("".join(bidi) + text + "".join(bidi), multiline=multiline)
    assert text_problem(shown, multiline=multiline) is None
    assert not any(control in shown for control in BIDI_CONTROLS)


def test_a_value_the_loader_cannot_build_is_an_error_not_a_crash():
    parsed = parse_job("name: x\ngrpo: {steps: " + "9" * 5000 + "}\n", "digits.yaml")
    assert parsed.spec is None and "a value cannot be read, column 15: a number of 5000" in parsed.errors[0].message
    assert parsed.errors[0].line == 2 and parsed.errors[0].key == "grpo.steps"


NUMBER_FORMS = {
    "decimal": lambda digits: "9" * digits,
    "hex": lambda digits: "0x" + "f" * digits,
    "octal": lambda digits: "0" + "7" * digits,
    "binary": lambda digits: "0b" + "1" * digits,
    "base 60": lambda digits: ":".join(["59"] * digits),
    "base 60 float": lambda digits: ":".join(["59"] * digits) + ".5",
    "float": lambda digits: "1." + "1" * digits + "e+3",
}


@settings(max_examples=60, deadline=None)
@given(form=st.sampled_from(sorted(NUMBER_FORMS)), digits=st.one_of(st.integers(1, 40), st.integers(41, 60_000)))
def test_a_number_of_any_size_or_base_is_refused_at_its_line_before_it_is_built(form, digits):
    written = NUMBER_FORMS[form](digits)
    text = json.dumps({**BASE, "grpo": {**BASE.get("grpo", {}), "steps": "@"}}).replace('"@"', written)
    started = time.monotonic()
    parsed = parse_job(text, "numbers.yaml")
    assert time.monotonic() - started < 1.0
    if len(written) > MAX_NUMBER_CHARS:
        [error] = parsed.errors
        assert error.line == 1 and "a value cannot be read" in error.message and written not in str(error)
        assert error.key == "grpo.steps"  # named, though refused before any value is built
    else:
        assert all(text_problem(escaped(str(e)), multiline=True) is None for e in parsed.errors)
        assert parsed.data is None or all(abs(v) <= MAX_INTEGER for v in numbers_of(parsed.data))


def numbers_of(value) -> list:
    if isinstance(value, dict):
        return [n for item in value.values() for n in numbers_of(item)]
    if isinstance(value, list):
        return [n for item in value for n in numbers_of(item)]
    return [value] if isinstance(value, int) and not isinstance(value, bool) else []


def test_the_raw_file_is_under_the_rule_too():
    parsed = parse_job("name: ok\n# \x00 a NUL in a comment\n", "raw.yaml")
    assert parsed.data is None and parsed.errors[0].line == 2 and "U+0000" in parsed.errors[0].message


# ----- generated input -------------------------------------------------------------------------------------

ANY_TEXT = st.text(st.characters(codec=None, categories=None), max_size=40)
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**40), max_value=10**40),
    st.floats(allow_nan=True, allow_infinity=True),
    ANY_TEXT,
)
VALUES = st.recursive(
    SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(ANY_TEXT, inner, max_size=4), max_leaves=20
)
KEY_PATHS = [tuple(parts(row.key)) for row in SCHEMA_ROWS if "*" not in row.key and "(key)" not in row.key]


def strings_of(value, found: list[str]) -> list[str]:
    if isinstance(value, str):
        found.append(value)
    elif isinstance(value, dict):
        for key, item in value.items():
            strings_of(key, found)
            strings_of(item, found)
    elif isinstance(value, (list, tuple)):
        for item in value:
            strings_of(item, found)
    return found


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(path=st.sampled_from(KEY_PATHS), value=VALUES)
def test_any_value_at_any_key_is_answered_quickly_and_nothing_unclean_or_unbounded_is_accepted(path, value):
    data = copy.deepcopy(BASE)
    node = data
    for part in path[:-1]:
        if isinstance(part, int):
            node = node[part] if isinstance(node, list) and node else node
            continue
        node = node.setdefault(part, {}) if isinstance(node, dict) else node
    if isinstance(node, dict):
        node[path[-1]] = value
    text = json.dumps(data, allow_nan=True)
    started = time.monotonic()
    parsed = parse_job(text, "generated.yaml")
    assert time.monotonic() - started < 1.0
    if parsed.spec is None:
        assert parsed.errors and all(text_problem(escaped(str(e)), multiline=True) is None for e in parsed.errors)
        return
    dumped = parsed.spec.model_dump(mode="python")
    for string in strings_of(dumped, []):
        assert text_problem(string, multiline=True) is None, repr(string)
    for row in SCHEMA_ROWS:
        if row.kind in ("integer", "number") and "*" not in row.key and "[]" not in row.key:
            node = dumped
            for part in parts(row.key):
                node = node.get(part) if isinstance(node, dict) else None
            assert node is None or isinstance(node, str) or node <= row.high, (row.key, node)


FORBIDDEN = st.one_of(
    st.integers(0x00, 0x08), st.integers(0x0B, 0x1F), st.integers(0x7F, 0x9F), st.integers(0xD800, 0xDFFF)
).map(chr)
STRING_PATHS = [
    ("name",),
    ("student", "model"),
    ("judge", "model"),
    ("judge", "rubric"),
    ("task", "system_prompt"),
    ("task", "few_shot", 0, "question"),
    ("rewards", 0, "name"),
    ("checkpoint", "best_metric"),
    ("tracking", "wandb_project"),
]


@settings(max_examples=200, deadline=None)
@given(path=st.sampled_from(STRING_PATHS), bad=FORBIDDEN, at=st.integers(0, 20), in_key=st.booleans())
def test_a_forbidden_character_anywhere_in_a_value_or_a_key_is_refused(path, bad, at, in_key):
    data = copy.deepcopy(BASE)
    node = data
    for part in path[:-1]:
        node = node[part]
    if in_key:  # a free-form mapping key: reward params
        data["rewards"][0]["params"] = {"sca" + bad + "le"[: at % 3]: 1}
    else:
        original = node[path[-1]]
        node[path[-1]] = original[:at] + bad + original[at:]
    parsed = parse_job(json.dumps(data), "dirty.yaml")  # the character as a JSON/YAML escape sequence
    raw = parse_job(yaml_text(data), "dirty.yaml")  # and as itself
    assert parsed.spec is None and raw.spec is None
    assert any(f"U+{ord(bad):04X}" in e.message for e in raw.errors), [str(e) for e in raw.errors]
    if 0xD800 <= ord(bad) <= 0xDFFF and parsed.data is None:
        return  # libyaml itself refuses an escaped lone surrogate (a YAML syntax error at its line)
    assert parsed.spec is None
    assert any(f"U+{ord(bad):04X}" in e.message for e in parsed.errors), [str(e) for e in parsed.errors]


@pytest.mark.parametrize(("key", "value"), [("steps", "true"), ("learning_rate", "false"), ("group_size", "yes")])
def test_true_or_false_is_no_number(key, value):
    # YAML's true and false are bools, an int subclass: `grpo.steps: true` was read as 1 step.
    text = json.dumps({**BASE, "grpo": {**BASE.get("grpo", {}), key: "@"}}).replace('"@"', value)
    parsed = parse_job(text, "bools.yaml")
    assert parsed.spec is None
    [error] = parsed.errors
    assert error.key == f"grpo.{key}" and "not true or false" in error.message
