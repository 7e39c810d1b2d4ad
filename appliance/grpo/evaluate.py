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


# Held-out scenarios an agent job evaluates when no limit is given (each is a whole greedy episode).
AGENT_EVAL_SCENARIOS = 32


def evaluate_environment(environment, engine: GenerationEngine, scenarios: int, max_new_tokens: int,
                         seed: int = 0, examples: int = 3) -> Evaluation:
    """Greedy episodes on `scenarios` held-out scenarios of an agent environment.

    accuracy: the share of episodes whose metrics["success"] is 1 (the environment's own measure: the right
    product, the right email, the target tile); format_compliance: the share with at least one tool call
    that was read and accepted; reward_means["total"]: the environment's mean reward.
    """
    from appliance.agents.source import EnvironmentSource

    started = time.monotonic()
    source = EnvironmentSource(environment, engine, Sampling(max_new_tokens=max_new_tokens, temperature=0.0),
                               seed=seed, split="held_out")
    trajectories = [t for group in source.collect(0, scenarios, 1) for t in group.trajectories]
    count = max(len(trajectories), 1)
    calls_accepted = [t.metrics.get("tool_calls", 0.0) - t.metrics.get("invalid_calls", 0.0) > 0 for t in trajectories]
    return Evaluation(
        problems=len(trajectories),
        accuracy=sum(t.metrics.get("success", 0.0) >= 1.0 for t in trajectories) / count,
        format_compliance=sum(calls_accepted) / count,
        reward_means={"total": sum(t.reward for t in trajectories) / count},
        completion_length_mean=sum(len(m.sampled.token_ids) for t in trajectories for m in t.assistant_turns()
                                   if m.sampled is not None) / count,
        seconds=time.monotonic() - started,
        examples=[{"scenario": t.scenario_id, "messages": t.to_openai(), "reward": t.reward,
                   "correct": t.metrics.get("success", 0.0) >= 1.0} for t in trajectories[:examples]],
    )


def evaluate_agent_student(student, environment, scenarios: int, max_new_tokens: int, use_adapter: bool,
                           seed: int = 0) -> Evaluation:
    """evaluate_environment through the student's own weights, adapter on or switched off (the base)."""
    from appliance.engines.hf import HFEngine

    engine = HFEngine(student.model, student.tokenizer, name="eval")
    with nullcontext() if use_adapter else student.model.disable_adapter():
        return evaluate_environment(environment, engine, scenarios, max_new_tokens, seed)
