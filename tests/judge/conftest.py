"""A scripted text source for the judge's parser, retry and fallback unit tests.

It stands in for a judge *model's output* only (the integration tests use the
real bundled model through HFEngine): each prompt is answered by a function of
the prompt text, and every generate call is recorded.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest

from appliance.engines.engine import Completion, EngineCounters, Sampling


class ScriptedEngine:
    def __init__(self, answer: Callable[[str], str], on_generate: Callable[[], None] | None = None):
        self.answer = answer
        self.on_generate = on_generate
        self.counters = EngineCounters()
        self.calls: list[tuple[list[str], Sampling]] = []

    def render_chat(self, messages):
        return "".join(f"<{m['role']}>{m['content']}</{m['role']}>\n" for m in messages)

    def generate(self, prompts, sampling):
        self.calls.append((list(prompts), sampling))
        if self.on_generate:
            self.on_generate()
        results = []
        for index, prompt in enumerate(prompts):
            text = self.answer(prompt)
            results.append(
                [
                    Completion(
                        index,
                        list(range(len(prompt.split()))),
                        list(range(len(text.split()))),
                        text,
                        [0.0] * len(text.split()),
                        "stop",
                    )
                ]
            )
        return results

    def update_adapter(self, adapter_dir: Path | None, version: int) -> None:
        pass

    def sleep(self) -> None:
        pass

    def wake(self) -> None:
        pass

    def close(self) -> None:
        pass


@pytest.fixture
def scripted_engine():
    return ScriptedEngine
