"""Agent rollouts of the bundled model through the in-process client: speed and token accounting per environment.

    PYTHONPATH=. APPLIANCE_TEST_DATA_DIR=.test-cache/data python bench/agent_rollouts.py [--scenarios 2 --group 4]

For each built-in environment: rollouts per second of `EngineChatClient` over
`HFEngine` (all rollouts of the step concurrent, batched into engine calls),
and per trajectory the trained (assistant) vs context tokens from
`tokenize_trajectory`, with drifted turns and context mismatches.
"""

from __future__ import annotations

import appliance.offline  # noqa: F401

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path

import torch

from appliance.agents.engine_client import EngineChatClient
from appliance.agents.environment import rollout_groups
from appliance.agents.loading import load_environment
from appliance.agents.tokenize import tokenize_trajectory
from appliance.engines.base import Sampling
from appliance.engines.hf import HFEngine
from appliance.models.provision import DEMO_MODEL_NAME, provision_demo
from appliance.models.store import ModelStore

ENVIRONMENTS = {"builtin:calculator": {}, "builtin:email_search": {}, "builtin:game2048": {"max_turns": 4}}


def measure(engine, name: str, options: dict, scenarios: int, group: int, max_new_tokens: int, max_turns: int | None):
    environment = load_environment(name, Path("."), options)
    if max_turns is not None:
        environment.max_turns = max_turns
    client = EngineChatClient(engine, Sampling(max_new_tokens=max_new_tokens, temperature=1.0, seed=0))
    started = time.monotonic()
    groups = asyncio.run(rollout_groups(environment, client, environment.scenarios("train", scenarios, seed=0), group))
    seconds = time.monotonic() - started
    tokenized = [tokenize_trajectory(engine.tokenizer, t) for g in groups for t in g.trajectories]
    trajectories = [t for g in groups for t in g.trajectories]
    return {
        "environment": name, "rollouts": len(trajectories), "seconds": round(seconds, 1),
        "rollouts_per_second": round(len(trajectories) / seconds, 3),
        "engine_calls": len(client.batch_sizes), "batch_sizes": client.batch_sizes,
        "turns_mean": statistics.mean(t.metrics["turns"] for t in trajectories),
        "trained_tokens": [t.trained_tokens for t in tokenized],
        "context_tokens": [t.context_tokens for t in tokenized],
        "drifted_turns": sum(t.drifted_turns for t in tokenized),
        "context_mismatches": sum(t.context_mismatches for t in tokenized),
        "reward_mean": round(statistics.mean(t.reward for t in trajectories), 3),
        "tool_calls": sum(t.metrics["tool_calls"] for t in trajectories),
        "malformed_calls": sum(t.metrics["malformed_calls"] for t in trajectories),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", type=int, default=2)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--max-turns", type=int, default=None, help="override every environment's turn limit")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    import os

    data_dir = Path(os.environ.get("APPLIANCE_TEST_DATA_DIR", ".test-cache/data"))
    provision_demo(data_dir)
    engine = HFEngine.load(ModelStore(data_dir).verify(DEMO_MODEL_NAME).path)
    for name, options in ENVIRONMENTS.items():
        print(json.dumps(measure(engine, name, options, args.scenarios, args.group, args.max_new_tokens,
                                 args.max_turns)), flush=True)


if __name__ == "__main__":
    main()
