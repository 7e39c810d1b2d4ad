"""Held-out evaluation of a policy: accuracy (agent jobs: success), format compliance, reward means.

Greedy by default (one completion or episode per problem or scenario); with
`EvalSampling(temperature, samples)` every problem or scenario is sampled
`samples` times at `temperature` from a fixed seed, and each share is over all
sampled completions or episodes, so two evaluations of one job (the base model
before, the adapter after) see the same problems, scenarios and random draws.
For question jobs accuracy counts completions whose `correctness` reward is 1;
format compliance counts completions with an `<answer>` block holding a number.
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field

from appliance.config.schema import CheckpointSpec, greedy_samples_problem
from appliance.engines.engine import GenerationEngine, Sampling
from appliance.grpo.rollout import generate_groups, score_groups
from appliance.grpo.step_record import EvalResult
from appliance.rewards.registry import WeightedReward
from appliance.rewards.rules import correctness, format_compliant
from appliance.tasks.task import Problem, Task


@dataclass(frozen=True)
class EvalSampling:
    """How held-out evaluation draws: greedy (temperature 0, one sample) or `samples` draws at `temperature`."""

    temperature: float = 0.0
    samples: int = 1
    seed: int = 0  # fixed per job, so every evaluation of it sees the same draws

    def __post_init__(self) -> None:
        if self.samples < 1 or self.temperature < 0.0:
            raise ValueError(
                f"evaluation needs samples >= 1 and temperature >= 0 (got {self.samples}, {self.temperature})"
            )
        problem = greedy_samples_problem(self.temperature, self.samples)
        if problem:
            raise ValueError(f"{problem}; sample at a temperature above 0")

    @classmethod
    def of(cls, checkpoint: CheckpointSpec, seed: int) -> "EvalSampling":
        """The job's checkpoint.eval_temperature and checkpoint.eval_samples, with the job's seed."""
        return cls(checkpoint.eval_temperature, checkpoint.eval_samples, seed)

    def engine_sampling(self, max_new_tokens: int) -> Sampling:
        """Greedy needs no seed (and seeding would reset the process's torch generator for nothing)."""
        return Sampling(
            max_new_tokens=max_new_tokens,
            n=self.samples,
            temperature=self.temperature,
            seed=self.seed if self.temperature > 0 else None,
        )


GREEDY = EvalSampling()


@dataclass
class Evaluation:
    problems: int  # distinct problems (agent jobs: scenarios); each was sampled `samples` times
    accuracy: float
    format_compliance: float
    reward_means: dict[str, float]
    completion_length_mean: float
    seconds: float
    examples: list[dict]
    temperature: float = 0.0
    samples: int = 1
    draws: int = 0  # completions or episodes the shares are over: problems x samples
    per_problem: list[float] = field(default_factory=list)  # each problem's share of correct draws, in order

    def to_dict(self) -> dict:
        return asdict(self)

    def summary(self) -> EvalResult:
        """The part a StepRecord and the run's result carry."""
        return EvalResult(
            accuracy=self.accuracy,
            format_compliance=self.format_compliance,
            reward_mean=self.reward_means.get("total", 0.0),
            problems=self.problems,
            temperature=self.temperature,
            samples=self.samples,
        )


def evaluate(
    engine: GenerationEngine,
    task: Task,
    problems: list[Problem],
    rewards: list[WeightedReward],
    max_new_tokens: int,
    examples: int = 5,
    how: EvalSampling = GREEDY,
) -> Evaluation:
    started = time.monotonic()
    _, groups = generate_groups(engine, task, problems, how.engine_sampling(max_new_tokens))
    drawn = [(problem, completion) for problem, group in zip(problems, groups) for completion in group]
    scores = score_groups(problems, groups, rewards) if rewards else None
    correct = [correctness(p.question, c.text, p.answer, dict(p.metadata)) >= 1.0 for p, c in drawn]
    formatted = [format_compliant(c.text) for _, c in drawn]
    count = max(len(drawn), 1)  # a data-parallel rank's share of the problems may be empty: its shares are 0 of 0
    means = {name: sum(v) / count for name, v in scores.per_function.items()} if scores else {}
    if scores:
        means["total"] = sum(scores.total) / count
    firsts = list(zip(drawn, correct))[:: how.samples][:examples]  # the first draw of each problem
    return Evaluation(
        problems=len(problems),
        accuracy=sum(correct) / count,
        format_compliance=sum(formatted) / count,
        reward_means=means,
        completion_length_mean=sum(len(c.token_ids) for _, c in drawn) / count,
        seconds=time.monotonic() - started,
        examples=[
            {"question": p.question, "reference": p.answer, "completion": c.text, "correct": ok}
            for (p, c), ok in firsts
        ],
        temperature=how.temperature,
        samples=how.samples,
        draws=len(drawn),
        per_problem=_shares(correct, [len(group) for group in groups]),
    )


def merge_evaluations(parts: list[Evaluation], examples: int = 5) -> Evaluation:
    """One evaluation from the parts data-parallel ranks evaluated, in rank order: shares weighted by draws."""
    if len(parts) == 1:
        return parts[0]
    draws = sum(part.draws for part in parts)

    def weighted(values: list[float]) -> float:
        return sum(value * part.draws for value, part in zip(values, parts)) / max(draws, 1)

    names = [name for name in parts[0].reward_means if all(name in part.reward_means for part in parts)]
    return Evaluation(
        problems=sum(part.problems for part in parts),
        accuracy=weighted([part.accuracy for part in parts]),
        format_compliance=weighted([part.format_compliance for part in parts]),
        reward_means={name: weighted([part.reward_means[name] for part in parts]) for name in names},
        completion_length_mean=weighted([part.completion_length_mean for part in parts]),
        seconds=max(part.seconds for part in parts),
        examples=[example for part in parts for example in part.examples][:examples],
        temperature=parts[0].temperature,
        samples=parts[0].samples,
        draws=draws,
        per_problem=[share for part in parts for share in part.per_problem],
    )


def _shares(flags: list[bool], sizes: list[int]) -> list[float]:
    """Consecutive runs of `sizes` flags -> the share of True in each."""
    shares, start = [], 0
    for size in sizes:
        shares.append(sum(flags[start : start + size]) / max(size, 1))
        start += size
    return shares


def evaluate_student(
    student,
    task: Task,
    problems: list[Problem],
    rewards: list[WeightedReward],
    max_new_tokens: int,
    use_adapter: bool,
    how: EvalSampling = GREEDY,
) -> Evaluation:
    """`evaluate` through the student's own weights, with its adapter on or switched off (the base)."""
    from appliance.engines.hf import HFEngine

    engine = HFEngine(student.model, student.tokenizer, name="eval")
    with nullcontext() if use_adapter else student.model.disable_adapter():
        return evaluate(engine, task, problems, rewards, max_new_tokens, how=how)


# Held-out scenarios an agent job evaluates when no limit is given (each is a whole episode).
AGENT_EVAL_SCENARIOS = 32


def evaluate_environment(
    environment,
    engine: GenerationEngine,
    scenarios: int,
    max_new_tokens: int,
    how: EvalSampling = GREEDY,
    examples: int = 3,
) -> Evaluation:
    """Episodes on `scenarios` held-out scenarios of an agent environment, `how.samples` of each.

    The scenarios and the draws come from `how.seed` alone (step 0 of an EnvironmentSource on the held-out
    split), so the base and the trained adapter play the same scenarios.
    accuracy: the share of episodes whose metrics["success"] is 1 (the environment's own measure: the right
    product, the right email, the target tile); format_compliance: the share with at least one tool call
    that was read and accepted; reward_means["total"]: the environment's mean reward.
    """
    from appliance.agents.trajectory_sources import EnvironmentSource

    started = time.monotonic()
    source = EnvironmentSource(
        environment, engine, how.engine_sampling(max_new_tokens), seed=how.seed, split="held_out"
    )
    groups = source.collect(0, scenarios, how.samples)
    trajectories = [t for group in groups for t in group.trajectories]
    count = max(len(trajectories), 1)
    calls_accepted = [t.metrics.get("tool_calls", 0.0) - t.metrics.get("invalid_calls", 0.0) > 0 for t in trajectories]
    succeeded = [t.metrics.get("success", 0.0) >= 1.0 for t in trajectories]
    return Evaluation(
        problems=len(groups),
        accuracy=sum(succeeded) / count,
        format_compliance=sum(calls_accepted) / count,
        reward_means={"total": sum(t.reward for t in trajectories) / count},
        completion_length_mean=sum(
            len(m.sampled.token_ids) for t in trajectories for m in t.assistant_turns() if m.sampled is not None
        )
        / count,
        seconds=time.monotonic() - started,
        examples=[
            {
                "scenario": g.trajectories[0].scenario_id,
                "messages": g.trajectories[0].to_openai(),
                "reward": g.trajectories[0].reward,
                "correct": g.trajectories[0].metrics.get("success", 0.0) >= 1.0,
            }
            for g in groups[:examples]
            if g.trajectories
        ],
        temperature=how.temperature,
        samples=how.samples,
        draws=len(trajectories),
        per_problem=_shares(succeeded, [len(group.trajectories) for group in groups]),
    )


def evaluate_agent_student(
    student, environment, scenarios: int, max_new_tokens: int, use_adapter: bool, how: EvalSampling = GREEDY
) -> Evaluation:
    """evaluate_environment through the student's own weights, adapter on or switched off (the base)."""
    from appliance.engines.hf import HFEngine

    engine = HFEngine(student.model, student.tokenizer, name="eval")
    with nullcontext() if use_adapter else student.model.disable_adapter():
        return evaluate_environment(environment, engine, scenarios, max_new_tokens, how)
