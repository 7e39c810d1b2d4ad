"""One judge prompt through its attempts (`JudgeRequest`), and what a response whose reading failed gets.

A request is one pointwise response or one ordered group; its `members` are
the judged texts, each with the items (judge/differential.py) that share it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Hashable, Sequence

from appliance.engines.engine import Completion
from appliance.judge.parse import JudgeOutputError, close_group_answer
from appliance.judge.probs import ScoreReading
from appliance.judge.prompts import GROUP_PREFILL, ReferenceAnchor, retry_messages
from appliance.judge.window import WindowCut

NEUTRAL_SCORE = 0.5


@dataclass
class JudgeRequest:
    """One judge prompt (one response, or one whole group in one order) through its attempts."""

    key: str
    messages: list[dict[str, str]]
    parse: Callable[[str], list[float]]
    max_new_tokens: int
    # One entry per judged response (in prompt order): the items that share its text and score.
    members: list[list[int]]
    # The start of the answer, written into the prompt (prompts.POINTWISE_PREFILL / GROUP_PREFILL).
    prefill: str = ""
    # Generate mode: where the answer must end (both engines) and its shape (engines that constrain).
    stop: tuple[str, ...] = ()
    regex: str | None = None
    # Probability mode: the texts whose next token is a score (one per response id in a group).
    score_prompts: list[str] = field(default_factory=list)
    # A group read by probabilities, numeric reference: what its score openings are anchored on (grouping.py).
    anchor: ReferenceAnchor | None = None
    # Reasoned mode: the judge's rationale, written before its score is read, and whether it was cut.
    rationale: str | None = None
    rationale_cut: bool = False
    readings: list[ScoreReading] = field(default_factory=list)
    prompt_text: str = ""
    outputs: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    scores: list[float] | None = None
    outcome: str = "ok"
    tokens_in: int = 0
    tokens_out: int = 0
    latency_seconds: float = 0.0
    # Responses cut to fit the judge's window (window.py), None when the prompt fitted as it was.
    cut: WindowCut | None = None

    # What it reads (differential.py: "full" or "core") and, in group mode, which of the group's orders (0 first).
    view: str = "full"
    order: int | None = None

    @property
    def item_indices(self) -> list[int]:
        return [index for shared in self.members for index in shared]

    @property
    def failed(self) -> list[bool]:
        """Per judged response: no usable score was read."""
        if self.scores is None:
            return [True] * len(self.members)
        return [score is None for score in self.scores]

    def next_messages(self) -> list[dict[str, str]]:
        if not self.outputs:
            return self.messages
        return retry_messages(self.messages, self.outputs[-1], self.errors[-1])

    def answered(self, completion: Completion, seconds: float) -> bool:
        """Count the wait; False (and the outcome set) when a remote engine's request failed after its retries."""
        self.latency_seconds += seconds
        if completion.error is None:
            return True
        # An outcome to count, not an answer to retry.
        self.errors.append(completion.error)
        self.outcome = "timeout" if completion.finish_reason == "timeout" else "parse_error"
        return False

    def record(self, completion: Completion, seconds: float) -> None:
        if not self.answered(completion, seconds):
            return
        answer = (
            close_group_answer(self.prefill + completion.text, len(self.members))
            if self.prefill == GROUP_PREFILL
            else self.prefill + completion.text
        )
        self.outputs.append(answer)
        self.tokens_in += len(completion.prompt_token_ids)
        self.tokens_out += len(completion.token_ids)
        try:
            self.scores = self.parse(answer)
        except JudgeOutputError as error:
            self.errors.append(str(error))


def failure_fill(scores: Sequence[float | None], group_keys: Sequence[Hashable], on_failure: str) -> list[float]:
    """Each None replaced per judge.on_failure: the group's mean (neutral_fill) or the lowest score, 0."""
    if on_failure == "minimum":
        return [0.0 if score is None else score for score in scores]
    return neutral_fill(scores, group_keys)


def neutral_fill(scores: Sequence[float | None], group_keys: Sequence[Hashable]) -> list[float]:
    """Replace each None by the mean of its group's judged scores (NEUTRAL_SCORE if none was judged).

    Neutral for GRPO: the filled member's deviation from its group mean is zero and the others' are unchanged.
    """
    judged: dict[Hashable, list[float]] = {}
    for score, key in zip(scores, group_keys):
        if score is not None:
            judged.setdefault(key, []).append(score)
    filled = []
    for score, key in zip(scores, group_keys):
        if score is None:
            members = judged.get(key)
            score = sum(members) / len(members) if members else NEUTRAL_SCORE
        filled.append(score)
    return filled
