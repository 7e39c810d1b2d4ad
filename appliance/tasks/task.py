"""What a training task is: problems split into train and held-out, and how a problem becomes chat messages."""

from __future__ import annotations

from appliance.errors import ApplianceError
import random
from dataclasses import dataclass, field
from typing import Sequence


class TaskError(ApplianceError):
    """The task section or its dataset is unusable; the message names the key, file or line to fix."""


@dataclass(frozen=True)
class Problem:
    """One prompt. `answer` is the reference the rewards compare against ("72"), None when there is none."""

    id: str
    question: str
    answer: str | None
    metadata: dict = field(default_factory=dict)


@dataclass(frozen=True)
class FewShot:
    question: str
    answer: str


@dataclass(frozen=True)
class Task:
    """Train and held-out problems of one dataset, plus the prompt dressing from the job file."""

    name: str
    train: list[Problem]
    held_out: list[Problem]
    system_prompt: str | None = None
    few_shot: tuple[FewShot, ...] = ()

    def messages(self, problem: Problem) -> list[dict[str, str]]:
        """Chat messages for `problem`: system prompt, few-shot turns, then the question.

        A problem that came with its own messages (JSONL `messages` rows) uses
        them as given, with the system prompt put first when they have none.
        """
        own = problem.metadata.get("messages")
        if own is not None:
            messages = [dict(message) for message in own]
            if self.system_prompt and not any(message["role"] == "system" for message in messages):
                messages.insert(0, {"role": "system", "content": self.system_prompt})
            return messages
        messages = []
        if self.system_prompt:
            messages.append({"role": "system", "content": self.system_prompt})
        for example in self.few_shot:
            messages.append({"role": "user", "content": example.question})
            messages.append({"role": "assistant", "content": example.answer})
        messages.append({"role": "user", "content": problem.question})
        return messages


def split_held_out(
    problems: Sequence[Problem], held_out: int, seed: int, source: str
) -> tuple[list[Problem], list[Problem]]:
    """Shuffle with `seed`; the first `held_out` problems are held out, the rest are for training."""
    if held_out >= len(problems):
        raise TaskError(
            f"task.held_out ({held_out}) must be smaller than the {len(problems)} problems of {source};"
            f" lower task.held_out or use a larger dataset"
        )
    shuffled = list(problems)
    # Seeded by the task's own seed: the same problems are held out in every run of the job, resumed or not.
    random.Random(seed).shuffle(shuffled)
    return shuffled[held_out:], shuffled[:held_out]
