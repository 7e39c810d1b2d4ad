"""The data half of a GRPO step: prompts -> completions -> rewards -> group advantages.

Every phase is a plain function call on plain data, so each can be tested
alone with real inputs. The result says which groups carry signal; only
those reach the trainer (with dynamic sampling, only the `selected` ones: grpo/sampling.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from appliance.engines.engine import Completion, GenerationEngine, Sampling
from appliance.grpo.advantages import GroupAdvantages, group_advantages
from appliance.grpo.update import TrainSample
from appliance.rewards.registry import RewardSample, RewardScores, WeightedReward, score_samples
from appliance.tasks.task import Problem, Task


@dataclass
class ScoredRollout:
    problems: list[Problem]
    prompts: list[str]
    groups: list[list[Completion]]  # groups[i] = the completions of problems[i]
    scores: RewardScores  # flattened group-major: index = i * group_size + j
    advantages: GroupAdvantages
    # [groups] bool: the groups the update trains on; None: every informative group.
    selected: torch.Tensor | None = None

    @property
    def trained(self) -> torch.Tensor:
        return self.advantages.informative if self.selected is None else self.selected

    @property
    def flat(self) -> list[Completion]:
        return [completion for group in self.groups for completion in group]

    @property
    def completion_lengths(self) -> list[int]:
        return [len(completion.token_ids) for completion in self.flat]

    def sample_records(self, step: int, tokenizer, limit: int) -> list[dict]:
        """samples.jsonl lines: the first `limit` completions of the step with their rewards and advantage."""
        records = []
        group_size = len(self.groups[0]) if self.groups else 1
        for index, completion in enumerate(self.flat[:limit]):
            group = index // group_size
            records.append(
                {
                    "step": step,
                    "question": self.problems[group].question,
                    "reference": self.problems[group].answer,
                    "completion": completion.text,
                    "reward": self.scores.total[index],
                    "rewards": {name: values[index] for name, values in self.scores.per_function.items()},
                    "advantage": float(self.advantages.advantages[group, index % group_size]),
                }
            )
        return records

    def train_samples(self, use_engine_logprobs: bool) -> list[TrainSample]:
        samples = []
        for group_index, group in enumerate(self.groups):
            if not bool(self.trained[group_index]):
                continue
            for member, completion in enumerate(group):
                if not completion.token_ids:
                    continue
                samples.append(
                    TrainSample(
                        prompt_ids=completion.prompt_token_ids,
                        completion_ids=completion.token_ids,
                        advantage=float(self.advantages.advantages[group_index, member]),
                        engine_logprobs=list(completion.logprobs) if use_engine_logprobs else None,
                    )
                )
        return samples


def generate_groups(engine: GenerationEngine, task: Task, problems: list[Problem], sampling: Sampling):
    prompts = [engine.render_chat(task.messages(problem)) for problem in problems]
    return prompts, engine.generate(prompts, sampling)


def score_groups(
    problems: list[Problem], groups: list[list[Completion]], rewards: list[WeightedReward]
) -> RewardScores:
    """Every reward on every completion; rules see the real token count as metadata["completion_tokens"]."""
    samples = [
        RewardSample(
            prompt=problem.question,
            completion=completion.text,
            reference=problem.answer,
            metadata={**problem.metadata, "completion_tokens": len(completion.token_ids)},
            group=index,
        )
        for index, (problem, group) in enumerate(zip(problems, groups))
        for completion in group
    ]
    return score_samples(rewards, samples)


def scored_rollout(
    problems: list[Problem],
    prompts: list[str],
    groups: list[list[Completion]],
    scores: RewardScores,
    scale_rewards: bool,
) -> ScoredRollout:
    """Group advantages of the weighted totals; groups whose rewards are all equal carry none."""
    totals = torch.tensor(scores.total, dtype=torch.float32).view(len(problems), -1)
    return ScoredRollout(problems, prompts, groups, scores, group_advantages(totals, scale_by_std=scale_rewards))
