"""Which prompts a step generates for and which groups it trains on: no compute spent on groups without signal.

Two options of the `grpo` section, both off by default: dynamic sampling
(`SamplingRounds`) and prompt skipping (`PromptSkipper`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from appliance.grpo.advantages import GroupAdvantages
from appliance.grpo.rollout import ScoredRollout
from appliance.rewards.registry import RewardScores
from appliance.tasks.task import Problem
from appliance.tasks.stream import ProblemStream


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
    )


def round_seed(step_seed: int, round_index: int) -> int:
    """Round 0 draws with the step's own seed (as without dynamic sampling); later rounds with seeds of their own."""
    return (step_seed + 104_729 * round_index) % (2**31 - 1)
