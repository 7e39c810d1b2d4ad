"""Agent rollouts of the bundled model through the in-process client: speed and token accounting per environment.

    PYTHONPATH=. APPLIANCE_TEST_DATA_DIR=.test-cache/data python bench/agent_rollouts.py [--scenarios 2 --group 4]

For each built-in environment: rollouts per second of `EngineChatClient` over
`HFEngine` (all rollouts of the step concurrent, batched into engine calls),
and per trajectory the trained (assistant) vs context tokens from
`tokenize_trajectory`, with drifted turns and context mismatches.

With `--train STEPS` it instead trains a small agent job on each environment
through `run_job` (the path `appliance train` takes) and prints, per step, the
reward, the seconds, and the trained vs context tokens of the recorded
trajectories: the reward curve and steps per minute of each environment.
"""

from __future__ import annotations

import appliance.offline  # noqa: F401

import argparse
import asyncio
import json
import os
import statistics
import time
from pathlib import Path

import torch

from appliance.agents.engine_client import EngineChatClient
from appliance.agents.environment import rollout_groups
from appliance.agents.environment_loader import load_environment
from appliance.agents.tokenize import tokenize_trajectory
from appliance.engines.engine import Sampling
from appliance.engines.hf import HFEngine
from appliance.models.provision import DEMO_MODEL_NAME, provision_demo
from appliance.models.store import ModelStore
from scratch_data import link_model_store

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
        "environment": name,
        "rollouts": len(trajectories),
        "seconds": round(seconds, 1),
        "rollouts_per_second": round(len(trajectories) / seconds, 3),
        "engine_calls": len(client.batch_sizes),
        "batch_sizes": client.batch_sizes,
        "turns_mean": statistics.mean(t.metrics["turns"] for t in trajectories),
        "trained_tokens": [t.trained_tokens for t in tokenized],
        "context_tokens": [t.context_tokens for t in tokenized],
        "drifted_turns": sum(t.drifted_turns for t in tokenized),
        "context_mismatches": sum(t.context_mismatches for t in tokenized),
        "reward_mean": round(statistics.mean(t.reward for t in trajectories), 3),
        "tool_calls": sum(t.metrics["tool_calls"] for t in trajectories),
        "malformed_calls": sum(t.metrics["malformed_calls"] for t in trajectories),
    }


TRAIN_JOB = """\
name: bench-{short}
student: {{model: smollm2-135m-instruct, quantization: nf4}}
task: {{environment: "builtin:{short}", max_turns: {turns}, environment_options: {options}}}
rewards: [{{name: environment}}]
grpo: {{group_size: {group}, prompts_per_step: {scenarios}, max_new_tokens: {tokens}, steps: {steps},
        learning_rate: 3.0e-4}}
checkpoint: {{every: {steps}}}
"""


def train(
    data_dir: Path, short: str, steps: int, scenarios: int, group: int, tokens: int, turns: int, options: dict
) -> None:
    import tempfile

    from appliance.job_checks import load_checked_job
    from appliance.grpo.records import read_jsonl
    from appliance.grpo.run import run_job

    with tempfile.TemporaryDirectory() as folder:
        folder = Path(folder)
        job_file = folder / "job.yaml"
        job_file.write_text(
            TRAIN_JOB.format(
                short=short,
                steps=steps,
                scenarios=scenarios,
                group=group,
                tokens=tokens,
                turns=turns,
                options=json.dumps(options),
            )
        )
        run_data = folder / "data"  # a fresh data dir that sees the provisioned models
        link_model_store(data_dir, run_data)
        job_dir = run_data / "jobs" / f"bench-{short}"
        load_before = os.getloadavg()[0]
        started = time.monotonic()
        run_job(load_checked_job(job_file, run_data), run_data, job_dir, job_file_dir=folder)
        minutes = (time.monotonic() - started) / 60
        samples = read_jsonl(job_dir / "samples.jsonl")  # the first 8 trajectories of each step
        records = read_jsonl(job_dir / "metrics.jsonl")
        for record in records:
            mine = [s for s in samples if s["step"] == record["step"]]
            print(
                json.dumps(
                    {
                        "environment": short,
                        "step": record["step"],
                        "reward_mean": round(record["reward_mean"], 3),
                        "groups_informative": f"{record['groups_informative']}/{record['groups_total']}",
                        "seconds": round(record["seconds"]["step"], 1),
                        "trained_tokens_step": record["trained_tokens"],
                        "trajectory_trained_tokens": [s["trained_tokens"] for s in mine],
                        "trajectory_context_tokens": [s["context_tokens"] for s in mine],
                        "tool_calls": sum(s["metrics"].get("tool_calls", 0) for s in mine),
                        "invalid_or_malformed_calls": sum(
                            s["metrics"].get("invalid_calls", 0) + s["metrics"].get("malformed_calls", 0) for s in mine
                        ),
                        "successes": sum(s["metrics"].get("success", 0) >= 1 for s in mine),
                    }
                ),
                flush=True,
            )
        print(
            json.dumps(
                {
                    "environment": short,
                    "options": options,
                    "steps": len(records),
                    "minutes": round(minutes, 2),
                    "steps_per_minute": round(len(records) / minutes, 3),
                    "reward_per_step": [round(r["reward_mean"], 3) for r in records],
                    "groups_informative": sum(r["groups_informative"] for r in records),
                    "groups_total": sum(r["groups_total"] for r in records),
                    "trained_tokens_per_trajectory": round(statistics.mean(s["trained_tokens"] for s in samples), 1),
                    "context_tokens_per_trajectory": round(statistics.mean(s["context_tokens"] for s in samples), 1),
                    "load_average_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
                }
            ),
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", type=int, default=2)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--max-turns", type=int, default=None, help="override every environment's turn limit")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--train",
        type=int,
        default=0,
        metavar="STEPS",
        help="train STEPS steps of an agent job per environment instead of timing rollouts",
    )
    parser.add_argument(
        "--environments", default=",".join(ENVIRONMENTS), help="comma-separated built-in environments (default: all)"
    )
    parser.add_argument(
        "--options",
        type=json.loads,
        default={},
        help="with --train: task.environment_options for each, as JSON (e.g. '{\"worked_examples\": 1}')",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    data_dir = Path(os.environ.get("APPLIANCE_TEST_DATA_DIR", ".test-cache/data"))
    provision_demo(data_dir)
    chosen = args.environments.split(",")
    unknown = [name for name in chosen if name not in ENVIRONMENTS]
    if unknown:
        parser.error(f"--environments: unknown {', '.join(unknown)} (built-ins: {', '.join(ENVIRONMENTS)})")
    if args.train:
        for name in chosen:
            train(
                data_dir,
                name.removeprefix("builtin:"),
                args.train,
                args.scenarios,
                args.group,
                args.max_new_tokens,
                args.max_turns or 3,
                args.options,
            )
        return
    engine = HFEngine.load(ModelStore(data_dir).verify(DEMO_MODEL_NAME).path)
    for name in chosen:
        options = ENVIRONMENTS[name]
        print(
            json.dumps(measure(engine, name, options, args.scenarios, args.group, args.max_new_tokens, args.max_turns)),
            flush=True,
        )


if __name__ == "__main__":
    main()
