"""The planner's prompt lengths are the real token counts of the rendered training prompts."""

from __future__ import annotations

from pathlib import Path

from appliance.job_checks import load_checked_job
from appliance.grpo.prompt_lengths import longest_prompt_tokens, measure_prompt_tokens
from appliance.models.causal_lm import load_tokenizer
from appliance.tasks.load import load_task

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_demo_job_prompts_are_measured_with_the_chat_template(store_data_dir, demo_model_dir):
    spec = load_checked_job(REPO_ROOT / "examples" / "multiply.yaml", store_data_dir)
    task = load_task(spec.task, REPO_ROOT / "examples")
    tokenizer = load_tokenizer(demo_model_dir)
    # Independently: render each prompt as text, then count its tokens.
    expected = max(
        len(
            tokenizer(
                tokenizer.apply_chat_template(task.messages(problem), tokenize=False, add_generation_prompt=True),
                add_special_tokens=False,
            )["input_ids"]
        )
        for problem in task.train
    )
    measured = measure_prompt_tokens(spec, demo_model_dir, REPO_ROOT / "examples")
    assert measured == expected == longest_prompt_tokens(task, tokenizer)
    # System prompt, two few-shot turns and the question: far more than a bare question.
    assert measured > 40
