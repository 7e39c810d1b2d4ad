"""An external agent, run as its own process by the tests: plays a built-in environment against a job's endpoint.

    python tests/agents/external_agent.py --url URL --token TOKEN --model NAME --out FILE
        [--environment builtin:calculator] [--groups 1] [--group-size 2] [--max-tokens 16] [--seed 0]

It uses only the `openai` package (through agents/openai_client.py) and the
environment's own rollout, writes the trajectory groups it played to FILE
as JSON ({"groups": [...], "latencies": [...], "completion_tokens": N}) and
submits nothing itself: the test submits through the daemon or the endpoint.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path


async def play(args) -> dict:
    from appliance.agents.environment import rollout_groups
    from appliance.agents.environment_loader import load_environment
    from appliance.agents.openai_client import OpenAIChatClient

    environment = load_environment(args.environment, Path(args.out).parent, {})
    environment.max_turns = args.max_turns
    client = OpenAIChatClient(args.url, args.token, args.model, max_tokens=args.max_tokens)
    try:
        scenarios = environment.scenarios("train", args.groups, seed=args.seed)
        groups = await rollout_groups(environment, client, scenarios, args.group_size)
    finally:
        await client.close()
    return {
        "groups": [group.model_dump(mode="json") for group in groups],
        "latencies": client.latencies,
        "completion_tokens": client.completion_tokens,
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    for name in ("--url", "--token", "--model", "--out"):
        parser.add_argument(name, required=True)
    parser.add_argument("--environment", default="builtin:calculator")
    parser.add_argument("--groups", type=int, default=1)
    parser.add_argument("--group-size", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--max-turns", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    Path(args.out).write_text(json.dumps(asyncio.run(play(args))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
