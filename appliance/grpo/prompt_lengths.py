"""The job's real prompt lengths, for the memory plan: every training prompt rendered with the chat template.

The system prompt and few-shot turns are part of every prompt, so the
longest one is measured rather than assumed (grpo.max_prompt_tokens is the
fallback when the tokenizer or the dataset is not at hand, as for a job
planned for another box). Large datasets are measured on an evenly spaced
sample of MAX_MEASURED prompts; the plan states that.
"""

from __future__ import annotations

from pathlib import Path

from appliance.config.schema import JobSpec

MAX_MEASURED = 4096


def longest_prompt_tokens(task, tokenizer, limit: int = MAX_MEASURED) -> int:
    """Tokens of the longest training prompt (chat template and generation prompt included)."""
    problems = list(task.train)
    if len(problems) > limit:
        stride = len(problems) / limit
        problems = [problems[int(i * stride)] for i in range(limit)]
    longest = 0
    for problem in problems:
        ids = tokenizer.apply_chat_template(task.messages(problem), tokenize=True, add_generation_prompt=True)
        if isinstance(ids, dict):  # some tokenizers return a BatchEncoding
            ids = ids["input_ids"]
        longest = max(longest, len(ids))
    return longest


def measure_prompt_tokens(spec: JobSpec, model_dir: Path, job_file_dir: Path) -> int | None:
    """longest_prompt_tokens for a job, or None when its tokenizer or dataset cannot be read here."""
    from appliance.tasks.load import load_task

    if not (Path(model_dir) / "tokenizer_config.json").is_file():
        return None
    from appliance.models.loading import load_tokenizer

    return longest_prompt_tokens(load_task(spec.task, job_file_dir), load_tokenizer(model_dir))
