"""Greedy evaluation of a policy on a list of problems: accuracy, format compliance, reward means.

Accuracy counts completions whose `correctness` reward is 1; format
compliance counts completions with an `<answer>` block holding a number.
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass

from appliance.engines.base import GenerationEngine, Sampling
from appliance.grpo.rollout import generate_groups, score_groups
from appliance.grpo.step_record import EvalResult
from appliance.rewards.registry import WeightedReward
from appliance.rewards.rules import correctness, format_compliant
from appliance.tasks.base import Problem, Task


@dataclass
class Evaluation:
    problems: int
    accuracy: float
    format_compliance: float
    reward_means: dict[str, float]
    completion_length_mean: float
    seconds: float
    examples: list[dict]

    def to_dict(self) -> dict:
        return asdict(self)

    def summary(self) -> EvalResult:
        """The part a StepRecord and the run's result carry."""
        return EvalResult(accuracy=self.accuracy, format_compliance=self.format_compliance,
                          reward_mean=self.reward_means.get("total", 0.0), problems=self.problems)


def evaluate(engine: GenerationEngine, task: Task, problems: list[Problem], rewards: list[WeightedReward],
             max_new_tokens: int, examples: int = 5) -> Evaluation:
    started = time.monotonic()
    _, groups = generate_groups(engine, task, problems, Sampling(max_new_tokens=max_new_tokens, temperature=0.0))
    completions = [group[0] for group in groups]
    scores = score_groups(problems, groups, rewards) if rewards else None
    correct = [correctness(p.question, c.text, p.answer, dict(p.metadata)) >= 1.0 for p, c in zip(problems, completions)]
    formatted = [format_compliant(c.text) for c in completions]
    count = max(len(problems), 1)
    means = {name: sum(v) / len(v) for name, v in scores.per_function.items()} if scores else {}
    if scores:
        means["total"] = sum(scores.total) / len(scores.total)
    return Evaluation(
        problems=len(problems),
        accuracy=sum(correct) / count,
        format_compliance=sum(formatted) / count,
        reward_means=means,
        completion_length_mean=sum(len(c.token_ids) for c in completions) / count,
        seconds=time.monotonic() - started,
        examples=[{"question": p.question, "reference": p.answer, "completion": c.text, "correct": ok}
                  for p, c, ok in list(zip(problems, completions, correct))[:examples]],
    )


def evaluate_student(student, task: Task, problems: list[Problem], rewards: list[WeightedReward],
                     max_new_tokens: int, use_adapter: bool) -> Evaluation:
    """Greedy evaluation through the student's own weights, with its adapter on or switched off (the base)."""
    from appliance.engines.hf import HFEngine

    engine = HFEngine(student.model, student.tokenizer, name="eval")
    with nullcontext() if use_adapter else student.model.disable_adapter():
        return evaluate(engine, task, problems, rewards, max_new_tokens)
