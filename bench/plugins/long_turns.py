"""An agent environment whose trajectories reach the memory plan's bound, for bench/memory_plan.py.

The plan budgets an agent trajectory as its opening plus, per turn, a reply of
grpo.max_new_tokens and up to 128 tokens of what follows it (tool results and
template glue). The calculator's episodes stop far short of that (two turns,
about 80 trained tokens in all), so its run cannot show whether the plan holds
at the bound. Here every turn is a story continuation the untrained model rarely ends
early, followed by a user message of about 150 tokens (with its template), for
`max_turns` turns: trajectories longer than the plan allows, which the trainer
cuts at its bound, so that every row of the update is as long as planned. The reward is a
hash of the replies, so that every group has a spread and trains.
"""

import hashlib
import random

from appliance.agents.trajectory import SystemMessage, Trajectory, UserMessage
from appliance.agents.environment import Scenario

SYSTEM = "You are a storyteller. Every reply continues the story at length, with new events and names."
TOPICS = ("a lighthouse keeper", "a lost robot", "a river town", "a mountain pass", "a night market", "an old ship")
# About 140 tokens with the SmolLM2 tokenizer; with the chat template's glue about 150.
FOLLOW_UP = (
    "Keep going. Describe what happens next in detail: where the characters are, what they see and hear, what "
    "they say to each other, what goes wrong, and how the weather changes. Bring in one new person with a "
    "name and a reason to be there, and one object that matters later. Do not end the story, do not summarise "
    "it, and do not ask me anything; just write the next part as vividly as you can, in the same voice as "
    "before, with short sentences and plain words. Then stop at a moment where something is about to happen. "
    "Remember the names you have used so far, keep the places consistent, and let the new person speak at least once."
)


class LongTurns:
    name = "long_turns"
    max_turns = 3

    def scenarios(self, split, count, seed):
        rng = random.Random(f"{split}-{seed}")
        return [Scenario(id=f"{split}-{seed}-{i}", data={"topic": rng.choice(TOPICS)}) for i in range(count)]

    async def rollout(self, client, scenario):
        messages = [
            SystemMessage(content=SYSTEM),
            UserMessage(content=f"Tell a long story about {scenario.data['topic']}."),
        ]
        replies = []
        for _ in range(self.max_turns):
            turn = await client.chat(list(messages), [])
            messages += [turn.message(), UserMessage(content=FOLLOW_UP)]
            replies.append(turn.text)
        digest = hashlib.sha256("\n".join(replies).encode()).hexdigest()
        return Trajectory(
            scenario_id=scenario.id,
            messages=messages,
            reward=int(digest[:8], 16) / 0xFFFFFFFF,
            metrics={"turns": float(self.max_turns), "success": 0.0},
            metadata={"environment": self.name},
        )
