"""Probability scoring with the bundled SmolLM2-135M-Instruct as judge, on the CPU.

The engine's next-token log-probabilities must equal a plain forward pass
(batched with padding and with a shared group prefix alike), and on rows of the
shipped labelled set both modes must score every response: no failure, a
distribution in every judge.jsonl line, and scores that differ between
responses (a judge whose calls all failed would give the neutral 0.5 to all).
"""

from __future__ import annotations

import json
import math
import re

import pytest

from appliance.cli.main import main
from appliance.config.schema import JudgeSpec
from appliance.engines.scoring import NotSingleTokenError
from appliance.judge import Judge
from appliance.judge.harness import load_rows, shipped_set_path
from appliance.judge.prompts import PROBABILITY_SCALE, group_item_prefill
from appliance.rewards.registry import RewardSample

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def engine(demo_model_dir):
    from appliance.engines.hf import HFEngine

    engine = HFEngine.load(demo_model_dir)
    yield engine
    engine.close()


def reference_logprobs(engine, prompt: str) -> dict[str, float]:
    import torch

    ids = engine.tokenizer(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        logits = engine.model(input_ids=ids).logits[0, -1].float()
    logprobs = torch.log_softmax(logits, dim=-1)
    return {digit: logprobs[engine.tokenizer.convert_tokens_to_ids(digit)].item() for digit in PROBABILITY_SCALE}


def test_next_token_logprobs_match_a_plain_forward_pass(engine):
    shared = engine.render_chat([{"role": "user", "content": "Rate these answers to 7 x 8: A) 56 B) 54 C) 65."}])
    group = [shared + group_item_prefill(i) for i in ("1", "2", "3")]  # one shared prefix: run once, then repeated
    mixed = [
        engine.render_chat([{"role": "user", "content": text}]) + '{"score": '
        for text in ("Is 2 + 2 = 4? Score it.", "Grade: the sky is green.")
    ]  # different lengths: padding
    for prompts in (group, mixed):
        got = engine.next_token_logprobs(prompts, list(PROBABILITY_SCALE))
        assert len(got) == len(prompts)
        for prompt, row in zip(prompts, got):
            want = reference_logprobs(engine, prompt)
            assert max(abs(row[d] - want[d]) for d in PROBABILITY_SCALE) < 1e-4
    with pytest.raises(NotSingleTokenError, match="'10' is not a single token"):
        engine.next_token_logprobs(mixed, ["9", "10"])


@pytest.mark.parametrize("mode", ["pointwise", "group"])
def test_every_row_is_scored_with_a_logged_distribution(engine, tmp_path, mode):
    rows = load_rows(shipped_set_path())[134:146]  # 6 questions, 2 answers each: 3 multiply, 3 GSM8K
    samples = [
        RewardSample(prompt=r.question, completion=r.response, reference=r.reference, group=i // 2)
        for i, r in enumerate(rows)
    ]
    spec = JudgeSpec(model="smollm2-135m-instruct", mode=mode, cache=False, differential_threshold=None)
    judge = Judge(spec, engine, log_path=tmp_path / "judge.jsonl")
    judge.set_step(1)
    scores = judge(samples)
    judge.close()

    assert judge.scoring == "probabilities"
    requests = len(rows)  # pointwise: one per row; group: 6 groups, two orders each
    assert judge.outcomes == {"ok": requests, "parse_error": 0, "timeout": 0}
    lines = [json.loads(line) for line in (tmp_path / "judge.jsonl").read_text().splitlines()]
    assert len(lines) == requests
    for line in lines:
        assert line["outcome"] == "ok" and line["scoring"] == "probabilities" and not line["errors"]
        assert len(line["distributions"]) == len(line["assigned"]) == len(line["scores"])
        for reading, score in zip(line["distributions"], line["scores"]):
            assert spec.min_score_mass <= reading["mass"] <= 1.0 + 1e-6
            assert math.isclose(sum(reading["probabilities"].values()), 1.0, abs_tol=0.01)
            expected = sum(int(v) * p for v, p in reading["probabilities"].items()) / 9
            assert score == pytest.approx(expected, abs=0.01)
    assert all(0.0 <= s <= 1.0 for s in scores)
    assert len({round(s, 6) for s in scores}) == len(scores)  # every response its own reading


def test_group_mode_ranks_the_answer_that_agrees_with_the_reference_first(engine, tmp_path):
    # The order probe's pairs (bench/judge_group_order.py): the same working, one product right, one off by a
    # factor. Without the anchor this judge ranked the wrong one first in two of these three.
    questions = [(9, 5), (5, 10), (9, 3)]
    samples = [
        RewardSample(
            f"What is {a} * {b}?", f"{a} * {b} = {product}, so <answer>{product}</answer>", str(a * b), group=g
        )
        for g, (a, b) in enumerate(questions)
        for product in (a * b, a * b + a)
    ]
    spec = JudgeSpec(model="smollm2-135m-instruct", mode="group", group_orders=2, cache=False)
    judge = Judge(spec, engine, log_path=tmp_path / "judge.jsonl")
    scores = judge(samples)
    judge.close()

    assert judge.outcomes == {"ok": 6, "parse_error": 0, "timeout": 0}  # 3 groups, 2 orders: every one read
    for g in range(len(questions)):
        assert scores[2 * g] > scores[2 * g + 1] + 0.02, (questions[g], scores)
    for line in (json.loads(text) for text in (tmp_path / "judge.jsonl").read_text().splitlines()):
        a, b = (int(n) for n in re.search(r"What is (\d+) \* (\d+)\?", line["prompt"]).groups())
        # The score prompt ends with the reference's entry at the top score, then response 1's own answer.
        ending = re.search(
            r'\{"id": "reference", "answer": "(\d+)", "score": 9\}\n\{"id": "1", "answer": "(\d+)", "score": $',
            line["prompt"],
        )
        assert ending is not None, line["prompt"][-200:]
        assert int(ending[1]) == a * b and int(ending[2]) in (a * b, a * b + a)

    plain = Judge(spec.model_copy(update={"group_anchor": False}), engine, log_path=tmp_path / "plain.jsonl")
    plain(samples[:2])
    plain.close()
    for line in (json.loads(text) for text in (tmp_path / "plain.jsonl").read_text().splitlines()):
        assert line["prompt"].endswith('<|im_start|>assistant\n{"id": "1", "score": ')  # switched off: no anchor


def test_judge_eval_cli_reports_every_probability_mode(store_data_dir, capsys):
    code = main(
        [
            "judge",
            "eval",
            "shipped",
            "--limit",
            "8",
            "--mode",
            "pointwise,group",
            "--scoring",
            "probabilities",
            "--json",
            "--data-dir",
            str(store_data_dir),
        ]
    )
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    guard = report["guard_on_gold_answers"]  # the guard on the shipped GSM8K gold solutions, under the warning
    assert guard["source"] == "builtin:gsm8k" and guard["total"] == 7473 and not guard["warning"]
    assert [(r["mode"], r["scoring"]) for r in report["reports"]] == [
        ("pointwise", "probabilities"),
        ("group", "probabilities"),
    ]
    for r in report["reports"]:
        assert r["rows"] == 8 and r["failures"] == 0 and r["failure_rate"] == 0.0
        # pointwise: one reading per row (each ends at its answer: no core to read); group: 4 groups, two orders
        assert r["requests"] == 8 and r["core_readings"] == 0
        assert (r["position_bias"] is None) == (r["mode"] == "pointwise")
        assert (
            r["score_std"] > 0 and r["prompt_tokens_per_completion"] > 100 and r["generated_tokens_per_completion"] == 0
        )
        assert 0.0 <= r["auc"] <= 1.0 and r["latency_p95_seconds"] >= r["latency_p50_seconds"] > 0


def test_reasoned_scoring_reads_the_score_after_the_models_own_rationale(engine, tmp_path):
    rows = load_rows(shipped_set_path())[134:136]  # one multiply question, a right and a wrong answer
    samples = [RewardSample(prompt=r.question, completion=r.response, reference=r.reference, group=0) for r in rows]
    spec = JudgeSpec(model="smollm2-135m-instruct", scoring="reasoned", cache=False, max_new_tokens=16)
    judge = Judge(spec, engine, log_path=tmp_path / "judge.jsonl")
    scores = judge(samples)
    judge.close()

    assert judge.outcomes == {"ok": 2, "parse_error": 0, "timeout": 0} and judge.stats()["generated_tokens"] > 0
    for line in (json.loads(text) for text in (tmp_path / "judge.jsonl").read_text().splitlines()):
        assert line["rationale"] and '"' not in line["rationale"]
        assert line["prompt"].endswith(f'{{"reason": "{line["rationale"]}", "score": ')
        assert line["distributions"][0]["mass"] >= spec.min_score_mass
    assert all(0.0 <= s <= 1.0 for s in scores) and scores[0] != scores[1]
