"""The data half of a GRPO step for a task's prompts: prompts -> completions -> rewards -> group advantages.

`PromptSource` draws the step's problems (each rank of a data-parallel job keeps its share), samples
`group_size` completions of each on the rollout engine (`generate`), scores them with every reward and turns
the weighted totals into group advantages (`score`). A group whose rewards are all equal carries no signal;
only groups with signal reach the update. Two options of `grpo` spend less on groups without signal:
dynamic sampling (`SamplingRounds`: more rounds of prompts until the batch holds enough) and prompt skipping
(`PromptSkipper`). Every phase is a plain function on plain data, so each can be tested alone.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch

from appliance.config.schema import JobSpec
from appliance.conventions import JUDGE_REWARD
from appliance.engines.engine import Completion, GenerationEngine, Sampling
from appliance.grpo.distributed import RankInfo, share
from appliance.grpo.update import TrainSample
from appliance.rewards.registry import RewardSample, RewardScores, WeightedReward, score_samples
from appliance.tasks.stream import ProblemStream
from appliance.tasks.task import Problem, Task

# Group advantages divide by std + EPSILON, so a group of near-equal rewards does not explode.
EPSILON = 1e-4


@dataclass(frozen=True)
class GroupAdvantages:
    advantages: torch.Tensor  # [groups, group_size]
    group_mean: torch.Tensor  # [groups]
    group_std: torch.Tensor  # [groups]
    informative: torch.Tensor  # [groups] bool: False when every reward in the group is equal


def group_advantages(
    rewards: torch.Tensor, scale_by_std: bool = True, equal_tolerance: float = 1e-6
) -> GroupAdvantages:
    """rewards: [groups, group_size] -> advantages of the same shape."""
    if rewards.dim() != 2 or rewards.shape[1] < 2:
        raise ValueError(f"rewards must be [groups, group_size>=2], got {tuple(rewards.shape)}")
    rewards = rewards.to(torch.float64)
    mean = rewards.mean(dim=1)
    std = rewards.std(dim=1, unbiased=True)
    centred = rewards - mean.unsqueeze(1)
    advantages = centred / (std.unsqueeze(1) + EPSILON) if scale_by_std else centred
    informative = (rewards.max(dim=1).values - rewards.min(dim=1).values) > equal_tolerance
    advantages = torch.where(informative.unsqueeze(1), advantages, torch.zeros_like(advantages))
    return GroupAdvantages(advantages.float(), mean.float(), std.float(), informative)


@dataclass
class ScoredRollout:
    problems: list[Problem]
    prompts: list[str]
    groups: list[list[Completion]]  # groups[i] = the completions of problems[i]
    scores: RewardScores  # flattened group-major: index = i * group_size + j
    advantages: GroupAdvantages
    # [groups] bool: the groups the update trains on; None: every informative group.
    selected: torch.Tensor | None = None
    # Where the completions came from: the adapter version that sampled them (None: the base) and the rank.
    policy_version: int | None = None
    rank: int = 0

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
                    "policy_version": self.policy_version,  # the adapter that sampled it: a stale one shows here
                    "rank": self.rank,
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


@dataclass
class PromptRecord:
    """One prompt's history: zero-spread groups in a row, and appearances skipped since it last generated."""

    streak: int = 0
    skipped: int = 0


class PromptSkipper:
    """The data cursor with settled prompts left out (`skip_settled_after: K`); `after` None skips nothing.

    A prompt whose last K groups all had no spread (every completion right, or every one wrong) is settled: its
    next K appearances in the data order are skipped, the (K+1)-th generates it again as a probe. A probe group
    with spread resets the prompt; one without keeps it settled for K more appearances. So a settled prompt costs
    a 1/(K+1) share of its generation. When every prompt left in a whole pass of the data is settled, the batch is
    filled with settled prompts (probes) rather than looping.
    """

    def __init__(self, stream: ProblemStream, after: int | None):
        if after is not None and after < 1:
            raise ValueError(f"skip_settled_after must be at least 1, got {after}")
        self.stream = stream
        self.after = after
        self.prompts: dict[str, PromptRecord] = {}
        self.skipped_last_batch = 0

    def settled(self, problem_id: str) -> bool:
        record = self.prompts.get(problem_id)
        return self.after is not None and record is not None and record.streak >= self.after

    def next_batch(self, n: int) -> list[Problem]:
        """The next n prompts of the data order that are not skipped; skipped ones are counted, not drawn again."""
        self.skipped_last_batch = 0
        if self.after is None:
            return self.stream.next_batch(n)
        batch: list[Problem] = []
        passed: list[Problem] = []
        # A bound: one whole pass of the data. Past it every remaining prompt is settled and probing is all left.
        for _ in range(len(self.stream.problems)):
            if len(batch) == n:
                break
            (problem,) = self.stream.next_batch(1)
            record = self.prompts.get(problem.id)
            if self.settled(problem.id) and record.skipped < self.after:
                record.skipped += 1
                passed.append(problem)
                continue
            batch.append(problem)
        probes = passed[: n - len(batch)]
        self.skipped_last_batch = len(passed) - len(probes)
        batch += probes
        batch += self.stream.next_batch(n - len(batch)) if len(batch) < n else []
        for problem in batch:
            if problem.id in self.prompts:
                self.prompts[problem.id].skipped = 0
        return batch

    def observe(self, problems: list[Problem], informative: list[bool]) -> None:
        """Each generated group's verdict: spread resets the prompt, none lengthens its streak."""
        if self.after is None:
            return
        for problem, has_spread in zip(problems, informative):
            record = self.prompts.setdefault(problem.id, PromptRecord())
            record.streak = 0 if has_spread else record.streak + 1

    def state_dict(self) -> dict:
        """JSON-ready: only prompts with a history (a prompt with spread and nothing skipped is the default)."""
        return {pid: [r.streak, r.skipped] for pid, r in self.prompts.items() if r.streak or r.skipped}

    def load_state_dict(self, state: dict) -> None:
        prompts = {}
        for pid, value in state.items():
            if not (isinstance(value, list) and len(value) == 2 and all(isinstance(v, int) and v >= 0 for v in value)):
                raise ValueError(
                    f"skipped-prompt state for {pid!r} must be [streak, skipped] (two counts), got {value!r}"
                )
            prompts[str(pid)] = PromptRecord(*value)
        self.prompts = prompts

    @property
    def settled_count(self) -> int:
        return sum(1 for pid in self.prompts if self.settled(pid))


@dataclass
class SamplingRounds:
    """The generation rounds of one step, and the rollout they make (`dynamic_sampling`, as DAPO does it).

    A group whose completions all earn the same reward has zero advantage and teaches nothing. The step keeps
    drawing `prompts_per_step` more prompts (a round) until it holds `prompts_per_step` informative groups or has
    run `max_sampling_rounds` rounds, and trains on the first `prompts_per_step` informative groups. Every
    generated group is counted in the step record (groups_total, groups_informative, groups_trained).
    """

    target: int  # informative groups the step wants: prompts_per_step
    max_rounds: int  # 1: no dynamic sampling
    rounds: list[ScoredRollout] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.target < 1 or self.max_rounds < 1:
            raise ValueError(f"target and max_rounds must be at least 1 (got {self.target}, {self.max_rounds})")

    @property
    def informative(self) -> int:
        return sum(int(part.advantages.informative.sum()) for part in self.rounds)

    def add(self, part: ScoredRollout) -> None:
        self.rounds.append(part)

    def wants_more(self) -> bool:
        """Another round only while the batch is short of informative groups and the bound allows it."""
        return len(self.rounds) < self.max_rounds and self.informative < self.target

    def rollout(self) -> ScoredRollout:
        """Every generated group (the record counts them all), training only the first `target` informative ones."""
        if not self.rounds:
            raise ValueError("no generation round to make a rollout of")
        merged = concat_rollouts(self.rounds)
        informative = merged.advantages.informative
        selected = informative & (torch.cumsum(informative.to(torch.int64), dim=0) <= self.target)
        merged.selected = selected
        return merged


def concat_rollouts(parts: list[ScoredRollout]) -> ScoredRollout:
    """Several rollouts of equal group size as one, in order (advantages are per group, so they carry over)."""
    names = list(parts[0].scores.per_function)
    fields = ("advantages", "group_mean", "group_std", "informative")
    return ScoredRollout(
        problems=[p for part in parts for p in part.problems],
        prompts=[p for part in parts for p in part.prompts],
        groups=[g for part in parts for g in part.groups],
        scores=RewardScores(
            {name: [v for part in parts for v in part.scores.per_function[name]] for name in names},
            [v for part in parts for v in part.scores.total],
        ),
        advantages=GroupAdvantages(*(torch.cat([getattr(part.advantages, f) for part in parts]) for f in fields)),
        # One version when every round was served by it; None (unknown) when rounds straddled an update.
        policy_version=parts[0].policy_version if len({part.policy_version for part in parts}) == 1 else None,
        rank=parts[0].rank,
    )


def round_seed(step_seed: int, round_index: int) -> int:
    """Round 0 draws with the step's own seed (as without dynamic sampling); later rounds with seeds of their own."""
    return (step_seed + 104_729 * round_index) % (2**31 - 1)


def rule_rewards(rewards: list[WeightedReward]) -> list[WeightedReward]:
    """Rule rewards only: evaluation does not spend judge calls."""
    return [reward for reward in rewards if reward.name != JUDGE_REWARD]


class PromptSource:
    """The task's prompts as a step's rollout: this rank's share of the problems, sampled, scored, advantaged."""

    def __init__(
        self, spec: JobSpec, task: Task, engine: GenerationEngine, rewards: list[WeightedReward], world: RankInfo
    ):
        self.spec, self.task, self.engine, self.rewards, self.world = spec, task, engine, rewards, world
        self.stream = ProblemStream(task.train, seed=spec.task.seed)
        after = spec.grpo.skip_settled_after
        self.skipper = PromptSkipper(self.stream, after) if after else None
        self.prompts_skipped = 0

    def rounds(self) -> SamplingRounds:
        grpo = self.spec.grpo
        return SamplingRounds(grpo.prompts_per_step, grpo.max_sampling_rounds if grpo.dynamic_sampling else 1)

    def generate(
        self, step: int, round_index: int
    ) -> tuple[list[Problem], list[str], list[list[Completion]], int | None]:
        """The round's problems (every rank draws the whole step's, keeps its share), their prompts and groups."""
        count = self.spec.grpo.prompts_per_step
        if round_index == 0:
            self.prompts_skipped = 0
        if self.skipper is not None:  # one rank only (job_checks.py): the skipper reads the whole stream
            problems = self.skipper.next_batch(count)
            self.prompts_skipped += self.skipper.skipped_last_batch
        else:
            problems = share(self.stream.next_batch(count), self.world.rank, self.world.world_size)
        sampling = self._sampling(step)
        sampling = (
            dataclasses.replace(sampling, seed=round_seed(sampling.seed, round_index)) if round_index else sampling
        )
        prompts, groups = generate_groups(self.engine, self.task, problems, sampling)
        # vLLM says which adapter served the batch; the other engines generate with the one they were last given.
        served = getattr(self.engine, "last_served_adapter_version", self.engine.adapter_version)
        return problems, prompts, groups, served

    def score(self, generated, step: int) -> ScoredRollout:
        """Every reward on every completion, the weighted totals, the group advantages."""
        problems, prompts, groups, served = generated
        scores = score_groups(problems, groups, self.rewards)
        scored = scored_rollout(problems, prompts, groups, scores, self.spec.grpo.scale_rewards)
        scored.policy_version, scored.rank = served, self.world.rank
        if self.skipper is not None:
            self.skipper.observe(problems, scored.advantages.informative.tolist())
        return scored

    def _sampling(self, step: int) -> Sampling:
        """Each step (and each rank) samples from its own seed, so a resumed run draws the same completions."""
        grpo = self.spec.grpo
        seed = (grpo.seed * 1_000_003 + step) % (2**31 - 1)
        return Sampling(
            max_new_tokens=grpo.max_new_tokens,
            n=grpo.group_size,
            temperature=grpo.temperature,
            top_p=grpo.top_p,
            seed=(seed + 7919 * self.world.rank) % (2**31 - 1),
        )

    def has_held_out(self) -> bool:
        return bool(self.task.held_out)

    def evaluate(self, student, engine: GenerationEngine | None, adapter: bool, limit: int | None, how):
        """This rank's contiguous part of the first `limit` held-out problems, scored by the rule rewards."""
        from appliance.grpo import evaluate

        problems = share(self.task.held_out[:limit] if limit else self.task.held_out, *self.world.part)
        rewards, max_new_tokens = rule_rewards(self.rewards), self.spec.grpo.max_new_tokens
        if engine is not None:
            return evaluate.evaluate(engine, self.task, problems, rewards, max_new_tokens, how=how)
        return evaluate.evaluate_student(
            student, self.task, problems, rewards, max_new_tokens, use_adapter=adapter, how=how
        )

    def checkpoint_state(self, step: int) -> dict:
        skipped = self.skipper.state_dict() if self.skipper is not None else {}
        return {"data_cursor": self.stream.state_dict(), "skipped_prompts": skipped}

    def load_state(self, state: dict) -> None:
        self.stream.load_state_dict(state["data_cursor"])
        if self.skipper is not None:
            self.skipper.load_state_dict(state.get("skipped_prompts", {}))

    def checkpointed(self, step: int) -> None:
        pass

    def close(self) -> None:
        pass
