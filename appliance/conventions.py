"""Spellings the job file and the code share, each defined once.

The judge's reward name, how a plugin reward is written, the prefix of the
datasets shipped inside the package, and the tool-call markup. Config checks, the reward registry,
the task loader and the trainer all read them from here.
"""

from __future__ import annotations

import re

# The reward supplied by the job's LLM judge (rewards: [{name: judge}]).
JUDGE_REWARD = "judge"
# An agent job's environment's own reward of each trajectory (rewards: [{name: environment}]).
ENVIRONMENT_REWARD = "environment"
# task.environment of an agent job whose trajectories are played elsewhere and submitted (the student endpoint).
EXTERNAL_ENVIRONMENT = "external"
# A plugin reward: "path/to/file.py:function".
PLUGIN_REWARD = re.compile(r"^(?P<file>.+\.py):(?P<function>[A-Za-z_][A-Za-z0-9_]*)$")
PLUGIN_SYNTAX = "path/to/file.py:function"
# task.dataset of a dataset shipped inside the package: builtin:multiply, builtin:gsm8k.
BUILTIN_DATASET_PREFIX = "builtin:"
# Tokens per turn an agent job's memory plan allows after a reply (tool results, error messages, the chat
# template's glue and the next turn's header): a built-in environment's own figure, else the assumed one.
# Planning reads them here, so it runs no environment code (budget/workload.py).
RESULT_TOKENS_ASSUMED = 128
# The calculator's longest tool message, an unreadable call's error, takes a little under this with its template
# (tests/agents/test_agent_job_config.py counts it).
BUILTIN_RESULT_TOKENS = {"builtin:calculator": 64}
# How an agent's tool call is written (agents/toolcalls.py); the judge's injection guard lets it through.
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"


def is_plugin_reward(name: str) -> bool:
    return PLUGIN_REWARD.match(name) is not None


def is_builtin_dataset(dataset: str) -> bool:
    return dataset.startswith(BUILTIN_DATASET_PREFIX)


def planned_result_tokens(environment: str) -> int:
    """Tokens per turn the memory plan allows after a reply in `environment` (plugins and external: assumed)."""
    return BUILTIN_RESULT_TOKENS.get(environment, RESULT_TOKENS_ASSUMED)
