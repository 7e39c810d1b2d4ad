"""The real bundled model plays every built-in environment through the in-process client, a few turns each.

Checks what no scripted policy can: the engine's sampled ids and logprobs end
up in the trajectory verbatim, the training context of every turn equals the
prompt the engine generated it from, the stored logprobs are the model's own
(teacher-forced forward pass over the tokenised trajectory), and concurrent
rollouts are batched into shared engine calls.
"""

from __future__ import annotations

import asyncio
import math

import pytest
import torch

from appliance.agents.engine_client import EngineChatClient
from appliance.agents.environment import AssistantTurn, rollout_groups
from appliance.agents.environment_loader import load_environment
from appliance.agents.tokenize import tokenize_trajectory
from appliance.agents.toolcalls import parse_tool_calls
from appliance.agents.trajectory import UserMessage
from appliance.engines.engine import Sampling

pytestmark = pytest.mark.model

# The untrained 135M model rarely writes a tool call, so an episode it plays alone ends after one turn. To play
# the multi-turn path (tool results in the context, a second turn generated after them) the first turn is
# this scripted call and the model writes every later turn.
FIRST_CALL = {
    "builtin:calculator": '<tool_call>{"name": "multiply", "arguments": {"a": 12, "b": 34}}</tool_call>',
    "builtin:email_search": '<tool_call>{"name": "search", "arguments": {"keywords": "meeting room"}}</tool_call>',
    "builtin:game2048": '<tool_call>{"name": "move", "arguments": {"direction": "left"}}</tool_call>',
}


class ScriptedFirstTurn:
    """Turn 1 from the script, the rest from the model through the in-process client."""

    def __init__(self, text: str, model: EngineChatClient):
        self.text, self.model = text, model

    async def chat(self, messages, tools):
        if isinstance(messages[-1], UserMessage):  # the first turn after the scenario's question
            return AssistantTurn(text=self.text, tool_calls=parse_tool_calls(self.text).calls)
        return await self.model.chat(messages, tools)


@pytest.fixture(scope="module")
def engine(demo_model_dir):
    from appliance.engines.hf import HFEngine

    engine = HFEngine.load(demo_model_dir)
    yield engine
    engine.close()


@pytest.mark.parametrize(
    "name, options",
    [
        ("builtin:calculator", {"held_out": 50}),
        ("builtin:email_search", {}),
        ("builtin:game2048", {"max_turns": 2}),
    ],
)
def test_the_bundled_model_plays_a_few_turns(engine, tmp_path, name, options):
    environment = load_environment(name, tmp_path, options)
    environment.max_turns = 2  # the scripted call, then one model turn: keeps this under a minute
    model = EngineChatClient(engine, Sampling(max_new_tokens=24, temperature=1.0, seed=0))
    client = ScriptedFirstTurn(FIRST_CALL[name], model)
    groups = asyncio.run(rollout_groups(environment, client, environment.scenarios("train", 2, seed=0), 1))

    assert model.batch_sizes == [2]  # the two concurrent model turns went to the engine as one batch
    trajectories = [t for g in groups for t in g.trajectories]
    assert len(trajectories) == 2 and all(math.isfinite(t.reward) for t in trajectories)
    for number, trajectory in enumerate(trajectories):
        scripted, generated = trajectory.assistant_turns()  # the worked example, if any, is context
        answer = trajectory.messages[trajectory.context_messages + 2]
        assert scripted.sampled is None and answer.role == "tool"  # the tool answered turn 1
        assert generated.sampled is not None and generated.sampled.token_ids
        tokenized = tokenize_trajectory(engine.tokenizer, trajectory)
        sampled_at = [i for i, logprob in enumerate(tokenized.logprobs) if logprob is not None]
        # exactly the sampled ids are trained, in place, with their logprobs
        assert [tokenized.input_ids[i] for i in sampled_at] == generated.sampled.token_ids
        assert [tokenized.logprobs[i] for i in sampled_at] == generated.sampled.logprobs
        assert all(tokenized.assistant_mask[i] for i in sampled_at)
        # the model's turn trains in the context it was generated from: the engine's own prompt ids
        assert tokenized.input_ids[: sampled_at[0]] == generated.sampled.prompt_token_ids
        assert tokenized.context_mismatches == 0
        assert tokenized.context_tokens > tokenized.trained_tokens > 0
        if number:
            continue  # one forward pass per environment is proof enough and keeps the test short

        # the stored logprobs are the model's (temperature 1, no top-p): a teacher-forced pass agrees
        with torch.no_grad():
            logits = engine.model(torch.tensor([tokenized.input_ids])).logits[0].float()
        recomputed = torch.log_softmax(logits[[i - 1 for i in sampled_at]], dim=-1)
        recomputed = recomputed.gather(1, torch.tensor([[tokenized.input_ids[i]] for i in sampled_at])).squeeze(1)
        assert torch.allclose(recomputed, torch.tensor(generated.sampled.logprobs), atol=2e-3)
