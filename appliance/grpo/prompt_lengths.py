"""The job's real prompt lengths, for the memory plan: every training prompt rendered with the chat template.

The system prompt and few-shot turns are part of every prompt, so the
longest one is measured rather than assumed (grpo.max_prompt_tokens is the
fallback when the tokenizer or the dataset is not at hand, as for a job
planned for another box). Large datasets are measured on an evenly spaced
sample of MAX_MEASURED prompts; the plan states that.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from appliance.config.schema import JobSpec

MAX_MEASURED = 4096
# Scenarios of an agent environment whose openings are measured.
OPENINGS_MEASURED = 64


def prompt_tokens(task, problem, tokenizer) -> int:
    """Tokens of one problem's prompt as the student sees it (chat template and generation prompt included)."""
    ids = tokenizer.apply_chat_template(task.messages(problem), tokenize=True, add_generation_prompt=True)
    if isinstance(ids, Mapping):  # transformers 5 returns a BatchEncoding (a UserDict, not a dict)
        ids = ids["input_ids"]
    return len(ids)


def longest_prompt_tokens(task, tokenizer, limit: int = MAX_MEASURED) -> int:
    """Tokens of the longest training prompt (chat template and generation prompt included)."""
    problems = list(task.train)
    if len(problems) > limit:
        stride = len(problems) / limit
        problems = [problems[int(i * stride)] for i in range(limit)]
    return max((prompt_tokens(task, problem, tokenizer) for problem in problems), default=0)


def longest_opening_tokens(environment, tokenizer, scenarios: int = OPENINGS_MEASURED) -> int | None:
    """Tokens of the longest opening (system prompt with the tools, worked examples, first user message,
    generation prompt) over `scenarios` training scenarios of an agent environment: what a trajectory holds
    before its first trained token. None when it is not a ToolEnvironment (only a rollout would show its opening)."""
    from appliance.agents.environment import ToolEnvironment
    from appliance.agents.toolcalls import template_messages
    from appliance.agents.trajectory import SystemMessage, UserMessage

    if not isinstance(environment, ToolEnvironment):
        return None
    longest = 0
    for scenario in environment.scenarios("train", scenarios, seed=0):
        _, system, user = environment.start(scenario)
        opening = [SystemMessage(content=system), *environment.examples(scenario), UserMessage(content=user)]
        messages = template_messages(opening, environment.tools())
        ids = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
        if isinstance(ids, Mapping):
            ids = ids["input_ids"]
        longest = max(longest, len(ids))
    return longest


def measure_prompt_tokens(spec: JobSpec, model_dir: Path, job_file_dir: Path) -> int | None:
    """longest_prompt_tokens for a job, or None when its tokenizer or dataset cannot be read here.

    Agent jobs measure the openings of a built-in environment; a plugin's or an external job's
    opening is not measured (planning runs no plugin code) and grpo.max_prompt_tokens stands for it.
    """
    from appliance.tasks.load import load_task

    if not (Path(model_dir) / "tokenizer_config.json").is_file():
        return None
    from appliance.models.causal_lm import load_tokenizer

    if spec.task.environment is not None:
        if not spec.task.environment.startswith("builtin:"):
            return None
        from appliance.agents.trajectory_sources import build_environment

        return longest_opening_tokens(build_environment(spec, Path(".")), load_tokenizer(model_dir))
    return longest_prompt_tokens(load_task(spec.task, job_file_dir), load_tokenizer(model_dir))
