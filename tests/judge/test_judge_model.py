"""The bundled SmolLM2-135M-Instruct judging its own real completions in reasoned (generate) mode, on the CPU.

A 135M model is a weak judge: its parse failures must be counted and
logged, never fatal, and every score must still be a valid 0..1 value.
"""

from __future__ import annotations

import json
import math

import pytest

from appliance.config.schema import JudgeSpec
from appliance.engines.engine import Sampling
from appliance.judge import Judge
from appliance.rewards.registry import RewardSample

pytestmark = pytest.mark.model

QUESTIONS = [("What is 7 x 8?", "56"), ("What is 12 x 3?", "36")]
LOG_FIELDS = {
    "step",
    "mode",
    "prompt",
    "raw_output",
    "scores",
    "outcome",
    "retries",
    "latency_seconds",
    "tokens_in",
    "tokens_out",
}


@pytest.fixture(scope="module")
def engine(demo_model_dir):
    from appliance.engines.hf import HFEngine

    engine = HFEngine.load(demo_model_dir)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def completions(engine) -> list[RewardSample]:
    """Two sampled answers to each question from the same model acting as the student."""
    prompts = [engine.render_chat([{"role": "user", "content": f"{q} Answer with the number."}]) for q, _ in QUESTIONS]
    outputs = engine.generate(prompts, Sampling(max_new_tokens=24, n=2, temperature=1.0, seed=3))
    return [
        RewardSample(prompt=q, completion=c.text, reference=r, group=g)
        for g, ((q, r), group) in enumerate(zip(QUESTIONS, outputs))
        for c in group
    ]


def read_log(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def check_scores(scores, samples):
    assert len(scores) == len(samples)
    assert all(isinstance(s, float) and math.isfinite(s) and 0.0 <= s <= 1.0 for s in scores)


@pytest.mark.parametrize("mode", ["pointwise", "group"])
def test_bundled_model_judges_real_completions(engine, completions, tmp_path, mode):
    log_path = tmp_path / "jobs" / "1" / "judge.jsonl"
    spec = JudgeSpec(
        model="smollm2-135m-instruct", mode=mode, scoring="generate", max_new_tokens=24, retries=1, timeout_seconds=3600
    )
    judge = Judge(spec, engine, log_path=log_path)
    judge.set_step(3)
    scores = judge(completions)
    judge.close()

    check_scores(scores, completions)
    lines = read_log(log_path)
    assert sum(judge.outcomes.values()) == len(lines)  # every request counted and logged
    # One full reading per distinct completion (pointwise) or per group in its first order; beside them, group
    # mode's other orders and the differential check's readings of answer cores.
    first = [line for line in lines if line["view"] == "full" and line["order"] in (None, 0)]
    assert len(first) == (len({s.completion for s in completions}) if mode == "pointwise" else len(QUESTIONS))
    assert all(line["view"] in ("full", "core") for line in lines)
    for line in lines:
        assert LOG_FIELDS <= set(line)
        assert (line["step"], line["mode"]) == (3, mode)
        assert line["outcome"] in ("ok", "parse_error")
        assert line["tokens_in"] > 0 and 0 < line["tokens_out"] <= (line["retries"] + 1) * spec.max_new_tokens * 2
        assert line["retries"] == len(line["earlier_outputs"]) <= spec.retries
        if line["outcome"] == "ok":
            assert all(0.0 <= s <= 1.0 for s in line["scores"])
        else:
            assert line["scores"] is None and line["errors"]
        for answer in line["earlier_outputs"] + [line["raw_output"]]:
            if mode == "pointwise" and "}" in answer:
                # Generation stopped at the closing brace: at most the rest of that one token follows it.
                assert len(answer.split("}", 1)[1]) <= 8, answer
            if mode == "group":
                assert '"id": "3"' not in answer  # never more ids than the 2 responses
    if mode == "group":
        # An unjudged group gets one constant, so it adds no advantage.
        assert all(len(set(line["assigned"])) == 1 for line in lines if line["outcome"] != "ok")
        assert all(QUESTIONS[0][0] in line["prompt"] or QUESTIONS[1][0] in line["prompt"] for line in lines)
        assert all('<response id="2" key=' in line["prompt"] for line in lines)
    stats = judge.stats()
    assert stats["generated_tokens"] > 0 and stats["tokens_per_second"] > 0
    assert stats["failures"] == judge.outcomes["parse_error"] + judge.outcomes["timeout"]
