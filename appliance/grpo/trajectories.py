"""The data half of an agent job's step: trajectory groups -> tokens and masks -> rewards -> group advantages.

A trajectory trains as one TrainSample: `prompt_ids` is everything before its
first assistant token (the scenario's opening under the chat template),
`completion_ids` the rest, and the train mask is `tokenize_trajectory`'s
assistant mask over that rest, so tool results, system, user and template
glue are context and only what the model sampled is trained, with the
logprobs it was sampled with. Trajectories longer than `max_tokens` (the
planned sequence length) are cut there: the cut part is neither trained nor
context, and the record says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from appliance.agents.render import opening_text, transcript_text
from appliance.agents.tokenize import TokenizedTrajectory, tokenize_trajectory
from appliance.agents.trajectory import Trajectory, TrajectoryGroup
from appliance.config.schema import JobSpec
from appliance.conventions import ENVIRONMENT_REWARD
from appliance.engines.engine import GenerationEngine
from appliance.grpo.rollout import GroupAdvantages, group_advantages
from appliance.grpo.update import TrainSample
from appliance.rewards.registry import RewardSample, RewardScores, WeightedReward, score_samples


class EnvironmentReward:
    """The reward named `environment`: the score the environment gave each trajectory."""

    name = ENVIRONMENT_REWARD

    def __call__(self, samples: list[RewardSample]) -> list[float]:
        return [float(sample.metadata["environment_reward"]) for sample in samples]


@dataclass
class TrajectoryTokens:
    """One trajectory as training data, cut to the bound; `cut_turn` when the cut fell inside an assistant turn."""

    tokens: TokenizedTrajectory
    truncated: bool  # cut to the planned bound
    cut_turn: bool = False
    finish_reasons: tuple[str, ...] = ()  # of the trained turns, as the engine reported them

    @property
    def first_trained(self) -> int | None:
        mask = self.tokens.assistant_mask
        return mask.index(1) if 1 in mask else None

    @property
    def length_cut(self) -> bool:
        """Cut anywhere: at the planned bound, or a turn at max_new_tokens (finish_reason "length")."""
        return self.truncated or "length" in self.finish_reasons


def tokens_of(tokenizer, trajectory: Trajectory, max_tokens: int | None) -> TrajectoryTokens:
    tokens = tokenize_trajectory(tokenizer, trajectory)
    reasons = tuple(m.sampled.finish_reason for _, m in trajectory.trained_turns() if m.sampled is not None)
    if max_tokens is None or len(tokens.input_ids) <= max_tokens:
        return TrajectoryTokens(tokens, truncated=False, finish_reasons=reasons)
    cut = TokenizedTrajectory(
        input_ids=tokens.input_ids[:max_tokens],
        assistant_mask=tokens.assistant_mask[:max_tokens],
        logprobs=tokens.logprobs[:max_tokens],
        drifted_turns=tokens.drifted_turns,
        context_mismatches=tokens.context_mismatches,
    )
    inside = bool(tokens.assistant_mask[max_tokens]) and bool(tokens.assistant_mask[max_tokens - 1])
    return TrajectoryTokens(cut, truncated=True, cut_turn=inside, finish_reasons=reasons)


def masked_for_truncation(item: TrajectoryTokens, mode: str) -> TrajectoryTokens:
    """`item` with its truncated part out of training: `mode` is task.mask_truncated (off | turn | trajectory)."""
    if mode == "off" or not item.length_cut:
        return item
    mask = list(item.tokens.assistant_mask)
    runs = _runs(mask)  # one run of trained tokens per trained turn, in order
    if mode == "trajectory" or len(runs) != len(item.finish_reasons):
        drop = runs  # a turn without tokens leaves the runs unmatched: the whole trajectory is the safe cut
    else:
        drop = [run for run, reason in zip(runs, item.finish_reasons) if reason == "length"]
        if item.cut_turn and runs:
            drop.append(runs[-1])
    for start, end in drop:
        mask[start:end] = [0] * (end - start)
    tokens = replace(item.tokens, assistant_mask=mask)
    return replace(item, tokens=tokens)


def _runs(mask: list[int]) -> list[tuple[int, int]]:
    runs, start = [], None
    for index, value in enumerate([*mask, 0]):
        if value and start is None:
            start = index
        elif not value and start is not None:
            runs.append((start, index))
            start = None
    return runs


def trained_transcript(tokenizer, trajectory: Trajectory, item: TrajectoryTokens) -> str:
    """What rewards and the judge read: the transcript, or for a trajectory cut to the bound exactly the kept text."""
    if not item.truncated:
        return transcript_text(trajectory)
    start = item.first_trained if item.first_trained is not None else len(item.tokens.input_ids)
    kept = tokenizer.decode(item.tokens.input_ids[start:], skip_special_tokens=True)
    return f"{kept}\n\n[cut here: the trajectory is longer than the {len(item.tokens.input_ids)} tokens trained]"


@dataclass
class ScoredTrajectories:
    environment: str
    groups: list[TrajectoryGroup]
    tokens: list[TrajectoryTokens]  # flat, group-major
    scores: RewardScores  # flat, group-major
    advantages: GroupAdvantages
    step: int | None = None  # the step that trains them: turns served at an earlier step are off-policy

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

    @property
    def trained(self) -> torch.Tensor:
        """[groups] bool: the groups the update trains on (every informative one)."""
        return self.advantages.informative

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
            # Served by an older adapter (external rollouts): the truncated importance weight corrects it.
            served = self.flat[index].metadata.get("served_step")
            off_policy = self.step is not None and served is not None and int(served) < self.step
            if use_engine_logprobs or off_policy:
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
                    **({"length_cut": True} if item.length_cut else {}),
                    "finish_reasons": list(item.finish_reasons),
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
    mask_truncated: str = "off",
    step: int | None = None,
) -> ScoredTrajectories:
    """Tokens, every job reward and group advantages of a step's trajectory groups.

    Each trajectory is scored as (prompt = its opening, completion = its transcript, agents/render.py), group = its
    scenario, by every job reward: `environment` is the environment's own reward, rules and plugins read the
    transcript, and the judge in group mode ranks the group's transcripts against each other (RULER).

    Rewards see what is trained (the transcript cut at the bound) and, in the sample's metadata, `truncated`
    (cut at the bound or a turn cut at max_new_tokens), `cut_to_bound`, `finish_reasons` and
    `turn_limit_reached`.
    """
    sizes = {len(group.trajectories) for group in groups}
    if len(sizes) != 1 or min(sizes) < 2:
        raise ValueError(f"every trajectory group needs the same size of at least 2, got sizes {sorted(sizes)}")
    flat = [(index, group, trajectory) for index, group in enumerate(groups) for trajectory in group.trajectories]
    tokens = [tokens_of(tokenizer, trajectory, max_tokens) for _, _, trajectory in flat]
    samples = [
        RewardSample(
            prompt=opening_text(trajectory),
            completion=trained_transcript(tokenizer, trajectory, item),
            reference=None,
            metadata={
                **trajectory.metrics,
                "environment_reward": trajectory.reward,
                "scenario_id": group.scenario_id,
                "truncated": item.length_cut,
                "cut_to_bound": item.truncated,
                "finish_reasons": list(item.finish_reasons),
                "turn_limit_reached": bool(trajectory.metrics.get("turn_limit_reached", 0.0)),
            },
            group=index,
        )
        for (index, group, trajectory), item in zip(flat, tokens)
    ]
    scores = score_samples(rewards, samples)
    totals = torch.tensor(scores.total, dtype=torch.float32).view(len(groups), -1)
    tokens = [masked_for_truncation(item, mask_truncated) for item in tokens]
    advantages = group_advantages(totals, scale_by_std=scale_rewards)
    return ScoredTrajectories(environment, groups, tokens, scores, advantages, step)


@dataclass
class AgentJob:
    """What the trainer needs for an agent job: where groups come from, and how long a trajectory may be."""

    source: object  # agents.source.TrajectorySource
    environment: str  # the job's task.environment, as written in samples.jsonl
    max_tokens: int | None  # the planned trajectory bound; longer trajectories are cut there
    evaluation_environment: object | None = None  # the in-process Environment for held-out evaluation, if any


@dataclass
class OneRound:
    """The rounds of an agent job's step: exactly one (dynamic sampling is for task prompts)."""

    rounds: list[ScoredTrajectories] = field(default_factory=list)

    def wants_more(self) -> bool:
        return not self.rounds

    def add(self, part: ScoredTrajectories) -> None:
        self.rounds.append(part)

    def rollout(self) -> ScoredTrajectories:
        (only,) = self.rounds
        return only


class AgentSource:
    """An agent job's step: trajectory groups collected from its source, scored by the job's rewards."""

    prompts_skipped = 0

    def __init__(self, spec: JobSpec, agent: AgentJob, tokenizer, rewards: list[WeightedReward], log):
        self.spec, self.agent, self.tokenizer, self.rewards, self.log = spec, agent, tokenizer, rewards, log

    def rounds(self) -> OneRound:
        return OneRound()  # an agent job's step is the groups its source hands over, once

    def generate(self, step: int, round_index: int) -> list[TrajectoryGroup]:
        grpo = self.spec.grpo
        return self.agent.source.collect(step, grpo.prompts_per_step, grpo.group_size)

    def score(self, groups: list[TrajectoryGroup], step: int) -> ScoredTrajectories:
        grpo = self.spec.grpo
        scored = score_trajectories(
            self.agent.environment,
            groups,
            self.tokenizer,
            self.rewards,
            grpo.scale_rewards,
            self.agent.max_tokens,
            self.spec.task.mask_truncated,
            step,
        )
        if scored.truncated:
            self.log(
                f"step {step}: {scored.truncated} trajectories were longer than the planned "
                f"{self.agent.max_tokens} tokens and were cut there"
            )
        return scored

    def has_held_out(self) -> bool:
        return self.agent.evaluation_environment is not None

    def evaluate(self, student, engine: GenerationEngine | None, adapter: bool, limit: int | None, how):
        from appliance.grpo import evaluate

        environment, max_new_tokens = self.agent.evaluation_environment, self.spec.grpo.max_new_tokens
        scenarios = limit or evaluate.AGENT_EVAL_SCENARIOS
        if engine is not None:
            return evaluate.evaluate_environment(environment, engine, scenarios, max_new_tokens, how)
        return evaluate.evaluate_agent_student(student, environment, scenarios, max_new_tokens, adapter, how)

    def checkpoint_state(self, step: int) -> dict:
        # An agent job's scenarios follow from the step number alone.
        return {"data_cursor": {"step": step}, "skipped_prompts": {}}

    def load_state(self, state: dict) -> None:
        pass

    def checkpointed(self, step: int) -> None:
        self.agent.source.checkpointed(step)  # submitted groups it trained need not be kept any more

    def close(self) -> None:
        self.agent.source.close()
