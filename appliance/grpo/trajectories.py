"""The data half of an agent job's step: trajectory groups -> tokens and masks -> rewards -> group advantages.

A trajectory trains as one TrainSample: `prompt_ids` is everything before its
first assistant token (the scenario's opening under the chat template),
`completion_ids` the rest, and the train mask is `tokenize_trajectory`'s
assistant mask over that rest, so tool results, system, user and template
glue are context and only what the model sampled is trained, with the
logprobs it was sampled with. The same GrpoUpdater and loss train single-turn
and multi-turn samples.

Rewards: each trajectory is scored as (prompt = its opening, completion = its
transcript, `agents/render.py`), group = its scenario, by every job reward:
`environment` is the environment's own reward, rules and plugins read the
transcript, and the judge in group mode ranks the group's transcripts against
each other (RULER). Advantages are grouped per scenario exactly as for
completions.

Trajectories longer than `max_tokens` (the planned sequence length) are cut
there: the cut part is neither trained nor context, and the record says so.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from appliance.agents.render import opening_text, transcript_text
from appliance.agents.tokenize import TokenizedTrajectory, tokenize_trajectory
from appliance.agents.trajectory import Trajectory, TrajectoryGroup
from appliance.conventions import ENVIRONMENT_REWARD
from appliance.grpo.advantages import GroupAdvantages, group_advantages
from appliance.grpo.update import TrainSample
from appliance.rewards.registry import RewardSample, RewardScores, WeightedReward, score_samples


class EnvironmentReward:
    """The reward named `environment`: the score the environment gave each trajectory."""

    name = ENVIRONMENT_REWARD

    def __call__(self, samples: list[RewardSample]) -> list[float]:
        return [float(sample.metadata["environment_reward"]) for sample in samples]


@dataclass
class TrajectoryTokens:
    """One trajectory as training data, cut to the bound."""

    tokens: TokenizedTrajectory
    truncated: bool

    @property
    def first_trained(self) -> int | None:
        mask = self.tokens.assistant_mask
        return mask.index(1) if 1 in mask else None


def tokens_of(tokenizer, trajectory: Trajectory, max_tokens: int | None) -> TrajectoryTokens:
    tokens = tokenize_trajectory(tokenizer, trajectory)
    if max_tokens is None or len(tokens.input_ids) <= max_tokens:
        return TrajectoryTokens(tokens, truncated=False)
    cut = TokenizedTrajectory(
        input_ids=tokens.input_ids[:max_tokens],
        assistant_mask=tokens.assistant_mask[:max_tokens],
        logprobs=tokens.logprobs[:max_tokens],
        drifted_turns=tokens.drifted_turns,
        context_mismatches=tokens.context_mismatches,
    )
    return TrajectoryTokens(cut, truncated=True)


@dataclass
class ScoredTrajectories:
    environment: str
    groups: list[TrajectoryGroup]
    tokens: list[TrajectoryTokens]  # flat, group-major
    scores: RewardScores  # flat, group-major
    advantages: GroupAdvantages

    @property
    def flat(self) -> list[Trajectory]:
        return [trajectory for group in self.groups for trajectory in group.trajectories]

    @property
    def completion_lengths(self) -> list[int]:
        """Trained (assistant) tokens per trajectory: what the model generated."""
        return [item.tokens.trained_tokens for item in self.tokens]

    @property
    def truncated(self) -> int:
        return sum(item.truncated for item in self.tokens)

    def advantage(self, index: int) -> float:
        size = len(self.groups[0].trajectories)
        return float(self.advantages.advantages[index // size, index % size])

    def train_samples(self, use_engine_logprobs: bool) -> list[TrainSample]:
        samples = []
        size = len(self.groups[0].trajectories)
        for index, item in enumerate(self.tokens):
            start = item.first_trained
            if start is None or not bool(self.advantages.informative[index // size]):
                continue
            tokens = item.tokens
            logprobs = None
            if use_engine_logprobs:
                if any(p is None for p, m in zip(tokens.logprobs[start:], tokens.assistant_mask[start:]) if m):
                    raise ValueError(
                        f"trajectory {index} has assistant tokens without sampled logprobs; "
                        "every trained turn must come from the rollout engine"
                    )
                logprobs = [p if p is not None else 0.0 for p in tokens.logprobs[start:]]
            samples.append(
                TrainSample(
                    prompt_ids=tokens.input_ids[:start],
                    completion_ids=tokens.input_ids[start:],
                    advantage=self.advantage(index),
                    engine_logprobs=logprobs,
                    train_mask=tokens.assistant_mask[start:],
                )
            )
        return samples

    def sample_records(self, step: int, tokenizer, limit: int) -> list[dict]:
        """samples.jsonl lines of kind "trajectory": messages, and the trained mask as decoded segments."""
        records = []
        for index, (trajectory, item) in enumerate(list(zip(self.flat, self.tokens))[:limit]):
            records.append(
                {
                    "step": step,
                    "kind": "trajectory",
                    "environment": self.environment,
                    "scenario": trajectory.scenario_id,
                    "reward": self.scores.total[index],
                    "rewards": {name: values[index] for name, values in self.scores.per_function.items()},
                    "advantage": self.advantage(index),
                    "metrics": dict(trajectory.metrics),
                    "messages": trajectory.to_openai(),
                    "segments": segments(tokenizer, item.tokens.input_ids, item.tokens.assistant_mask),
                    "trained_tokens": item.tokens.trained_tokens,
                    "context_tokens": item.tokens.context_tokens,
                    **({"truncated": True} if item.truncated else {}),
                }
            )
        return records


def segments(tokenizer, input_ids: list[int], mask: list[int]) -> list[dict]:
    """The decoded runs of equal mask value: how the operator sees what was trained."""
    runs: list[dict] = []
    start = 0
    for end in range(1, len(input_ids) + 1):
        if end == len(input_ids) or mask[end] != mask[start]:
            runs.append({"text": tokenizer.decode(input_ids[start:end]), "trained": bool(mask[start])})
            start = end
    return runs


def score_trajectories(
    environment: str,
    groups: list[TrajectoryGroup],
    tokenizer,
    rewards: list[WeightedReward],
    scale_rewards: bool,
    max_tokens: int | None,
) -> ScoredTrajectories:
    """Tokens, every job reward and group advantages of a step's trajectory groups."""
    sizes = {len(group.trajectories) for group in groups}
    if len(sizes) != 1 or min(sizes) < 2:
        raise ValueError(f"every trajectory group needs the same size of at least 2, got sizes {sorted(sizes)}")
    samples = [
        RewardSample(
            prompt=opening_text(trajectory),
            completion=transcript_text(trajectory),
            reference=None,
            metadata={**trajectory.metrics, "environment_reward": trajectory.reward, "scenario_id": group.scenario_id},
            group=index,
        )
        for index, group in enumerate(groups)
        for trajectory in group.trajectories
    ]
    scores = score_samples(rewards, samples)
    totals = torch.tensor(scores.total, dtype=torch.float32).view(len(groups), -1)
    tokens = [tokens_of(tokenizer, trajectory, max_tokens) for group in groups for trajectory in group.trajectories]
    return ScoredTrajectories(environment, groups, tokens, scores, group_advantages(totals, scale_by_std=scale_rewards))


@dataclass
class AgentJob:
    """What the trainer needs for an agent job: where groups come from, and how long a trajectory may be."""

    source: object  # agents.source.TrajectorySource
    environment: str  # the job's task.environment, as written in samples.jsonl
    max_tokens: int | None  # the planned trajectory bound; longer trajectories are cut there
    evaluation_environment: object | None = None  # the in-process Environment for held-out evaluation, if any
