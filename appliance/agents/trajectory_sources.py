"""Where an agent job's trajectory groups come from: the TrajectorySource interface and its in-process source.

The trainer asks its source once per step for `scenarios` groups of
`group_size` trajectories (`collect(step, scenarios, group_size)`) and trains
on what comes back; it never knows who played them. Two sources exist:

- `EnvironmentSource`: an Environment played in this process through an
  `EngineChatClient` over the job's rollout engine. Every rollout of a step
  runs concurrently (the client batches their turns into engine calls); the
  step number picks the scenarios and the sampling seed, so a resumed run
  plays exactly the steps an uninterrupted one would have.
- `ExternalSource` (agents/external_source.py, "external"): groups played elsewhere
  against the job's student endpoint and submitted through the control API.

`make_source` is the one place a job's `task.environment` becomes a source.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import replace
from pathlib import Path
from typing import Callable, Protocol, runtime_checkable

from appliance.agents.engine_client import EngineChatClient
from appliance.agents.environment import AgentEnvironmentError, Environment, Split, rollout_groups
from appliance.agents.environment_loader import load_environment
from appliance.agents.trajectory import TrajectoryGroup
from appliance.config.schema import JobSpec
from appliance.conventions import EXTERNAL_ENVIRONMENT
from appliance.engines.engine import GenerationEngine, LocalEngine, Sampling


@runtime_checkable
class TrajectorySource(Protocol):
    def collect(self, step: int, scenarios: int, group_size: int) -> list[TrajectoryGroup]:
        """`scenarios` groups of `group_size` trajectories (one scenario each) for training step `step` (1-based)."""

    def checkpointed(self, step: int) -> None:
        """Steps up to `step` are in a complete checkpoint: what the source kept to replay them may go."""

    def close(self) -> None:
        """Release what the source holds (servers, clients); the source is unusable afterwards."""


def step_seed(seed: int, step: int) -> int:
    """The seed of step `step`: scenarios and sampling draw from it, so a resume replays the same step."""
    # Seed and step mixed by two primes, kept below 2**31 - 1, a seed every generator takes.
    return (seed * 1_000_003 + step * 7_919) % (2**31 - 1)


class EnvironmentSource:
    """An Environment played in process against the rollout engine; one sampling seed per step."""

    def __init__(
        self,
        environment: Environment,
        engine: GenerationEngine,
        sampling: Sampling,
        seed: int = 0,
        split: Split = "train",
        max_batch_size: int = 64,
    ):
        self.environment = environment
        self.engine = engine
        self.sampling = replace(sampling, n=1)  # one reply per chat call; a group is group_size rollouts
        self.seed = seed
        self.split = split
        self.max_batch_size = max_batch_size
        self.batch_sizes: list[int] = []  # engine batch sizes of the last collect, for metrics and tests

    @property
    def name(self) -> str:
        return self.environment.name

    def collect(self, step: int, scenarios: int, group_size: int) -> list[TrajectoryGroup]:
        seed = step_seed(self.seed, step)
        chosen = self.environment.scenarios(self.split, scenarios, seed)
        if not chosen:
            raise AgentEnvironmentError(f"environment {self.name!r} gave no {self.split} scenarios")
        client = EngineChatClient(self.engine, replace(self.sampling, seed=seed), self.max_batch_size)
        # A fresh event loop per step: the trainer is synchronous, and nothing of a step's rollouts outlives it.
        groups = asyncio.run(rollout_groups(self.environment, client, chosen, group_size))
        self.batch_sizes = list(client.batch_sizes)
        return groups

    def checkpointed(self, step: int) -> None:
        """Nothing kept: a replayed step plays its scenarios again from the step's seed."""

    def close(self) -> None:
        """Nothing to release: the engine belongs to the trainer."""


def build_environment(spec: JobSpec, data_dir: Path) -> Environment:
    """The environment `spec.task.environment` names, with `task.environment_options` and `task.max_turns`."""
    name = spec.task.environment
    if name is None:
        raise AgentEnvironmentError("this job has no task.environment; it trains on task.dataset")
    if name == EXTERNAL_ENVIRONMENT:
        raise AgentEnvironmentError(
            "task.environment 'external' has no in-process environment: its trajectories are submitted from outside"
        )
    environment = load_environment(name, data_dir, dict(spec.task.environment_options))
    if spec.task.max_turns is not None:
        if not hasattr(environment, "max_turns"):
            raise AgentEnvironmentError(
                f"task.max_turns: environment {name!r} has no max_turns attribute to override; drop task.max_turns"
            )
        environment.max_turns = spec.task.max_turns
    return environment


def rollout_sampling(spec: JobSpec) -> Sampling:
    """Per-turn sampling of an agent job: grpo.max_new_tokens is the budget of each assistant turn."""
    grpo = spec.grpo
    return Sampling(
        max_new_tokens=grpo.max_new_tokens, n=1, temperature=grpo.temperature, top_p=grpo.top_p, seed=grpo.seed
    )


def make_source(
    spec: JobSpec,
    engine: LocalEngine,
    data_dir: Path,
    *,
    job_dir: Path | None = None,
    stop_requested: Callable[[], str | None] | None = None,
    max_sequence_tokens: int | None = None,
) -> TrajectorySource:
    """The trajectory source of an agent job (`task.environment` set): the one place the key is read.

    "external" serves the student endpoint over `engine` (the rollout engine: transformers or vLLM) and writes
    its address and token into `job_dir` (agents/external_source.py); `stop_requested` lets its `collect` give up
    waiting when the job is asked to stop.
    """
    if spec.task.environment == EXTERNAL_ENVIRONMENT:
        from appliance.agents.endpoint_bind import bind_from_environment
        from appliance.agents.external_source import ExternalSource
        from appliance.engines.openai_server import SamplingPolicy

        if job_dir is None:
            raise AgentEnvironmentError(
                "task.environment 'external' needs the job folder (make_source(job_dir=...)):"
                " the endpoint's address and token are written there"
            )
        return ExternalSource(
            engine,
            job_dir,
            spec.grpo.group_size,
            served_name=spec.student.model,
            # Room for several steps of submissions, so agents can run ahead of the trainer without being refused.
            max_queued_groups=max(16, 4 * spec.grpo.prompts_per_step),
            stop_requested=stop_requested,
            policy=SamplingPolicy(
                spec.grpo.temperature,
                spec.grpo.top_p,
                max_tokens=spec.grpo.max_new_tokens,
                max_sequence_tokens=max_sequence_tokens,  # the plan's: no served prompt grows past it
                max_n=spec.grpo.group_size,
            ),
            max_staleness=spec.task.max_staleness,
            bind=bind_from_environment(os.environ),
            # Set by the daemon (`appliance serve --external-idle-timeout`); a foreground run waits for ever.
            idle_seconds=float(os.environ.get("APPLIANCE_EXTERNAL_IDLE_SECONDS") or 0),
        )
    return EnvironmentSource(build_environment(spec, data_dir), engine, rollout_sampling(spec), seed=spec.grpo.seed)
