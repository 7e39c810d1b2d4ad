"""Where a step's scored groups come from: a task's prompts, or an agent environment's trajectories.

The Trainer picks one source at construction. Each source owns its rollout, its held-out
evaluation, what a checkpoint keeps of it, and what it releases at the end.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Protocol

from appliance.config.schema import JobSpec
from appliance.conventions import JUDGE_REWARD
from appliance.engines.engine import GenerationEngine, Sampling
from appliance.grpo.phases import PhaseClock
from appliance.grpo.rollout import ScoredRollout, generate_groups, score_groups, scored_rollout
from appliance.grpo.sampling import PromptSkipper, SamplingRounds, round_seed
from appliance.grpo.trajectories import AgentJob, ScoredTrajectories, score_trajectories
from appliance.rewards.registry import WeightedReward
from appliance.tasks.task import Task
from appliance.tasks.stream import ProblemStream


def rule_rewards(rewards: list[WeightedReward]) -> list[WeightedReward]:
    """Rule rewards only: evaluation does not spend judge calls."""
    return [reward for reward in rewards if reward.name != JUDGE_REWARD]


class RolloutSource(Protocol):
    prompts_skipped: int  # prompts the data order passed over this step (skip_settled_after)
    sampling_rounds: int  # generation rounds of this step (dynamic_sampling)

    def rollout(self, clock: PhaseClock, step: int) -> ScoredRollout | ScoredTrajectories: ...

    def has_held_out(self) -> bool: ...

    def evaluate(
        self, student, engine: GenerationEngine | None, adapter: bool, limit: int | None, how, part=(0, 1)
    ): ...

    def checkpoint_state(self, step: int) -> dict: ...

    def load_state(self, state: dict) -> None: ...

    def checkpointed(self, step: int) -> None: ...

    def close(self) -> None: ...


class PromptSource:
    """Completions to the task's prompts, scored by the rewards; with dynamic sampling, rounds until the batch is full."""

    def __init__(
        self,
        spec: JobSpec,
        task: Task,
        engine: GenerationEngine,
        rewards: list[WeightedReward],
        sampling: Callable[[int], Sampling],
    ):
        self.spec, self.task, self.engine, self.rewards, self.sampling = spec, task, engine, rewards, sampling
        self.stream = ProblemStream(task.train, seed=spec.task.seed)
        after = spec.grpo.skip_settled_after
        self.skipper = PromptSkipper(self.stream, after) if after else None
        self.prompts_skipped = 0
        self.sampling_rounds = 1

    def rollout(self, clock: PhaseClock, step: int) -> ScoredRollout:
        grpo = self.spec.grpo
        rounds = SamplingRounds(grpo.prompts_per_step, grpo.max_sampling_rounds if grpo.dynamic_sampling else 1)
        self.prompts_skipped = 0
        while rounds.wants_more():
            rounds.add(self._round(clock, step, len(rounds.rounds)))
        self.sampling_rounds = len(rounds.rounds)
        return rounds.rollout()

    def _round(self, clock: PhaseClock, step: int, index: int) -> ScoredRollout:
        count = self.spec.grpo.prompts_per_step
        problems = self.skipper.next_batch(count) if self.skipper is not None else self.stream.next_batch(count)
        self.prompts_skipped += self.skipper.skipped_last_batch if self.skipper is not None else 0
        sampling = self.sampling(step)
        sampling = dataclasses.replace(sampling, seed=round_seed(sampling.seed, index)) if index else sampling
        with clock.phase("generate"):
            prompts, groups = generate_groups(self.engine, self.task, problems, sampling)
        with clock.phase("reward"):
            scores = score_groups(problems, groups, self.rewards)
        scored = scored_rollout(problems, prompts, groups, scores, self.spec.grpo.scale_rewards)
        if self.skipper is not None:
            self.skipper.observe(problems, scored.advantages.informative.tolist())
        return scored

    def has_held_out(self) -> bool:
        return bool(self.task.held_out)

    def evaluate(self, student, engine: GenerationEngine | None, adapter: bool, limit: int | None, how, part=(0, 1)):
        """part: (rank, world size) of a data-parallel job: this rank evaluates its contiguous part of the problems."""
        from appliance.grpo import evaluate
        from appliance.grpo.distributed import share

        problems = share(self.task.held_out[:limit] if limit else self.task.held_out, *part)
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


class AgentSource:
    """Trajectory groups collected from the agent job's source, scored by the environment's rewards."""

    prompts_skipped = 0
    sampling_rounds = 1

    def __init__(self, spec: JobSpec, agent: AgentJob, tokenizer, rewards: list[WeightedReward], log):
        self.spec, self.agent, self.tokenizer, self.rewards, self.log = spec, agent, tokenizer, rewards, log

    def rollout(self, clock: PhaseClock, step: int) -> ScoredTrajectories:
        grpo = self.spec.grpo
        with clock.phase("generate"):
            groups = self.agent.source.collect(step, grpo.prompts_per_step, grpo.group_size)
        with clock.phase("reward"):
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

    def evaluate(self, student, engine: GenerationEngine | None, adapter: bool, limit: int | None, how, part=(0, 1)):
        from appliance.grpo import evaluate

        if part != (0, 1):
            raise ValueError("an agent job evaluates on one rank")  # RankTrainer refuses agent jobs
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
