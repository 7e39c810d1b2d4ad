"""The served-token ledger: what a job's endpoint served, and the check that submitted trajectories are only that.

Every completion the student endpoint returns is recorded under a hash of
(prompt token ids, completion token ids), with the text and the logprobs it
returned. A submitted trajectory is accepted only when each assistant turn
names, by its `sampled.prompt_token_ids` and `sampled.token_ids`, a completion
in the ledger that no earlier submission used, with the same text and
logprobs; and, given the tokenizer, when the conversation before each turn
renders to exactly the prompt that turn was served for. So an agent cannot
train the student on text it did not generate (a forged or edited turn), on
an edited context, or on one good completion twice; nor say how a turn ended
(the engine's finish reason is recorded and replaces the submitted one), nor
add messages after its last served turn for rules or the judge to read.
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from appliance.agents.served_tokens_file import LedgerFile, served_line
from appliance.agents.toolcalls import parse_tool_calls, template_messages
from appliance.agents.trajectory import AssistantMessage, TrajectoryGroup
from appliance.errors import ApplianceError

DEFAULT_CAPACITY = 16384
LOGPROB_TOLERANCE = 1e-4  # JSON round trips keep doubles exact; this only forgives float32 re-encodings


class TrajectoryRefused(ApplianceError):
    """A submission the job will not train on; the message names the group, trajectory and turn."""


@dataclass
class Served:
    """One served completion; `served` counts identical serves (same ids, text and logprobs), `used` those submitted."""

    text: str
    logprobs: tuple[float, ...]
    step: int
    used: int = 0
    served: int = 1
    sampling: dict | None = None  # the sampling parameters it was served with (temperature, top_p)
    finish_reason: str = "stop"  # the engine's: "length" when max_tokens cut it


def served_key(prompt_ids: list[int], token_ids: list[int]) -> bytes:
    """A digest of one completion and the prompt it was generated from (lengths first: no ambiguity)."""
    digest = hashlib.sha256(struct.pack("<QQ", len(prompt_ids), len(token_ids)))
    digest.update(struct.pack(f"<{len(prompt_ids)}q", *prompt_ids))
    digest.update(struct.pack(f"<{len(token_ids)}q", *token_ids))
    return digest.digest()


class ServedLedger:
    """Bounded record of served completions, optionally kept in a file (`path`); thread-safe.

    The oldest entries go first: a job that keeps more completions unsubmitted than `capacity` loses the oldest.
    Kept in a file (agents/served_tokens_file.py), it outlives the worker: a restarted worker of the same job still
    accepts what the earlier one served and still refuses what it did not serve or what was already submitted.
    """

    def __init__(self, capacity: int = DEFAULT_CAPACITY, path: Path | None = None):
        if capacity < 1:
            raise ValueError("the ledger needs room for at least one completion")
        self.capacity = capacity
        self._entries: OrderedDict[bytes, Served] = OrderedDict()
        self._lock = threading.Lock()
        self._file = LedgerFile(path) if path is not None else None
        if self._file is not None:
            for line in self._file.read():
                self._replay(line)
            self._file.rewrite(self._lines())  # drops a damaged tail, so appends start on a fresh line

    def __len__(self) -> int:
        return len(self._entries)

    def record(
        self,
        prompt_ids: list[int],
        token_ids: list[int],
        text: str,
        logprobs: list[float],
        step: int,
        sampling: dict | None = None,
        finish_reason: str = "stop",
    ) -> None:
        """One served completion, with the step (adapter version), the sampling it was served with and the
        engine's finish reason."""
        key = served_key(prompt_ids, token_ids)
        with self._lock:
            self._add(key, text, tuple(logprobs), step, sampling, finish_reason)
            if self._file is not None:
                self._file.append(
                    served_line(key, text, logprobs, step, sampling=sampling, finish_reason=finish_reason)
                )
                # Compacted once the appended lines reach twice what the ledger holds: the file stays bounded and
                # a rewrite happens once per capacity's worth of serves.
                if self._file.lines > 2 * self.capacity:
                    self._file.rewrite(self._lines())

    def verify(
        self, raw_groups: list[Any], group_size: int, tokenizer=None, freshness: Freshness | None = None
    ) -> list[TrajectoryGroup]:
        """The submitted groups, typed, when every assistant turn was served and unused; marks those turns used."""
        groups, keys = self.check(raw_groups, group_size, tokenizer, freshness)
        self.mark_used(keys)
        return groups

    def check(
        self, raw_groups: list[Any], group_size: int, tokenizer=None, freshness: Freshness | None = None
    ) -> tuple[list[TrajectoryGroup], list[bytes]]:
        """The submitted groups, typed, and the keys of their turns; marks nothing (see `mark_used`).

        With `freshness`, a turn served more than `max_staleness` steps before the step that will train it is
        refused. Each accepted trajectory's metadata gets `served_step` (its oldest turn's step) and
        `served_sampling`, and each turn the engine's finish reason, written here from the ledger (whatever the
        client put there is replaced: a turn cut at max_tokens trains as cut). Messages after the last served turn
        are nobody's output the ledger can vouch for (a "VERIFIED" tool result, a user's "Great job"): they are
        left out of the trajectory, so neither rules nor the judge read them, and `unserved_messages_dropped`
        in its metadata says how many (absent when none).
        """
        # Parsed before the lock: malformed input is refused without holding up the serving threads.
        groups = [_parse_group(index, raw, group_size) for index, raw in enumerate(raw_groups)]
        with self._lock:
            keys: list[bytes] = []
            for g, group in enumerate(groups):
                for t, trajectory in enumerate(group.trajectories):
                    where = f"group {g} (scenario {group.scenario_id!r}), trajectory {t}"
                    if not math.isfinite(trajectory.reward):
                        raise TrajectoryRefused(f"{where}: the reward is {trajectory.reward}; give a finite number")
                    turns = trajectory.trained_turns()
                    if not turns:
                        raise TrajectoryRefused(f"{where} has no assistant turn: there is nothing to train")
                    served = []
                    for number, (m, message) in enumerate(turns):
                        turn_where = f"{where}, assistant turn {number} (message {m})"
                        # The keys taken so far ride along: a turn repeated inside one submission counts twice.
                        keys.append(self._check_turn(turn_where, message, keys))
                        served.append(self._entries[keys[-1]])
                        if freshness is not None:
                            freshness.check(turn_where, served[-1].step)
                        trajectory.messages[m] = _as_served(message, served[-1])
                    trajectory.metadata["served_step"] = min(entry.step for entry in served)
                    trajectory.metadata["served_sampling"] = served[0].sampling
                    _drop_unserved_tail(trajectory, turns[-1][0])
                    if tokenizer is not None:
                        _check_context(where, trajectory, tokenizer)
        return groups, keys

    def mark_used(self, keys: list[bytes]) -> None:
        """These completions were submitted and accepted (a key once per use): they train once. Fsynced with a file."""
        with self._lock:
            fresh = [key for key in keys if self._use(key)]
            if fresh and self._file is not None:
                self._file.append({"used": [key.hex() for key in fresh]}, durable=True)

    def mark_used_at_least(self, keys: list[bytes]) -> None:
        """After a restart: the turns of groups still queued count as used, in case the crash came before
        `mark_used` recorded them (never more uses than these keys name, so nothing is counted twice)."""
        needed: dict[bytes, int] = {}
        for key in keys:
            needed[key] = needed.get(key, 0) + 1
        missing = [
            key
            for key, count in needed.items()
            if key in self._entries
            for _ in range(max(0, count - self._entries[key].used))
        ]
        self.mark_used(missing)

    def _use(self, key: bytes) -> bool:
        served = self._entries.get(key)
        # An evicted or fully used key is skipped, not an error: a replayed "used" line may name either.
        if served is None or served.used >= served.served:
            return False
        served.used += 1
        return True

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()

    def _add(
        self,
        key: bytes,
        text: str,
        logprobs: tuple[float, ...],
        step: int,
        sampling: dict | None,
        finish_reason: str = "stop",
    ) -> None:
        """One more serve of `key`: the same completion again counts once more, anything else replaces it."""
        same = self._entries.get(key)
        if same is not None and same.text == text and _close(same.logprobs, logprobs):
            # Two rollouts of a group can sample the very same completion: each may be submitted once.
            self._insert(key, Served(text, logprobs, step, same.used, same.served + 1, sampling, finish_reason))
        else:
            self._insert(key, Served(text, logprobs, step, sampling=sampling, finish_reason=finish_reason))

    def _insert(self, key: bytes, served: Served) -> None:
        self._entries[key] = served
        self._entries.move_to_end(key)  # a serve again makes a completion young again
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)

    def _replay(self, line: dict[str, Any]) -> None:
        if "key" in line:
            key = bytes.fromhex(line["key"])
            logprobs = tuple(float(v) for v in line["logprobs"])
            reason = line.get("finish_reason", "stop")
            if "served" in line:  # a rewritten entry carries its counts (served_line writes both or neither)
                counts = line.get("used", 0), line.get("served", 1)
                self._insert(key, Served(line["text"], logprobs, line["step"], *counts, line.get("sampling"), reason))
            else:  # an appended serve
                self._add(key, line["text"], logprobs, line["step"], line.get("sampling"), reason)
            return
        for key in map(bytes.fromhex, line["used"]):
            self._use(key)

    def _lines(self) -> list[dict[str, Any]]:
        return [
            served_line(key, s.text, s.logprobs, s.step, s.used, s.served, s.sampling, s.finish_reason)
            for key, s in self._entries.items()
        ]

    def _check_turn(self, where: str, message: AssistantMessage, taken: list[bytes]) -> bytes:
        sampled = message.sampled
        if sampled is None or sampled.prompt_token_ids is None:
            raise TrajectoryRefused(
                f"{where} carries no sampled token ids; submit the prompt_token_ids, token_ids and logprobs"
                " the endpoint returned with it"
            )
        key = served_key(sampled.prompt_token_ids, sampled.token_ids)
        served = self._entries.get(key)
        if served is None:
            raise TrajectoryRefused(
                f"{where} was not served by this job's endpoint: no completion it served has"
                " these prompt and completion token ids (edited, forged, or too old)"
            )
        if served.used + taken.count(key) >= served.served:
            raise TrajectoryRefused(f"{where} was already submitted: each served completion trains once")
        if message.content != served.text:
            raise TrajectoryRefused(
                f"{where}: the text differs from what the endpoint served for these token ids (edited or cut,"
                " e.g. at a stop string); submit the content exactly as served"
            )
        # Structured calls are rendered into the next prompt when the text lacks them: they must be the served ones.
        if message.tool_calls and _calls(message.tool_calls) != _calls(parse_tool_calls(served.text).calls):
            raise TrajectoryRefused(
                f"{where}: its tool_calls differ from the calls the endpoint served for this turn (added, dropped"
                " or edited); submit the tool_calls exactly as served"
            )
        if not _close(served.logprobs, sampled.logprobs):
            raise TrajectoryRefused(f"{where}: the logprobs differ from those the endpoint served")
        return key


@dataclass(frozen=True)
class Freshness:
    """How old a served turn may be: `step` is the step that will train it, `max_staleness` the job's bound."""

    step: int
    max_staleness: int

    def check(self, where: str, served_step: int) -> None:
        age = self.step - served_step
        if age > self.max_staleness:
            raise TrajectoryRefused(
                f"{where} is stale: it was served at step {served_step} and would train at step {self.step},"
                f" {age} steps later; this job accepts turns at most task.max_staleness = {self.max_staleness}"
                " steps old (an older policy sampled it); roll it out again"
            )


def _as_served(message: AssistantMessage, served: Served) -> AssistantMessage:
    """The turn with the engine's finish reason in place of the one the client submitted."""
    if message.sampled is None or message.sampled.finish_reason == served.finish_reason:
        return message
    return message.model_copy(
        update={"sampled": message.sampled.model_copy(update={"finish_reason": served.finish_reason})}
    )


def _drop_unserved_tail(trajectory, last_turn: int) -> None:
    """Messages after the last served turn leave the trajectory, and its metadata says how many."""
    dropped = len(trajectory.messages) - last_turn - 1
    if dropped:
        trajectory.messages = trajectory.messages[: last_turn + 1]
        trajectory.metadata["unserved_messages_dropped"] = dropped


def _calls(calls) -> list[tuple[str, Any]]:
    """Tool calls as (name, arguments) to compare; arguments that are not JSON compare as their text."""
    out = []
    for call in calls:
        try:
            arguments = json.loads(call.function.arguments)
        except json.JSONDecodeError:
            arguments = ("not JSON", call.function.arguments)
        out.append((call.function.name, arguments))
    return out


def trained_turn_keys(groups: list[TrajectoryGroup]) -> list[bytes]:
    """The ledger keys of every trained assistant turn in `groups` (groups that were accepted)."""
    return [
        served_key(message.sampled.prompt_token_ids, message.sampled.token_ids)
        for group in groups
        for trajectory in group.trajectories
        for _, message in trajectory.trained_turns()
        if message.sampled is not None and message.sampled.prompt_token_ids is not None
    ]


def _close(a, b) -> bool:
    return len(a) == len(b) and all(abs(x - y) <= LOGPROB_TOLERANCE for x, y in zip(a, b))


def _parse_group(index: int, raw: Any, group_size: int) -> TrajectoryGroup:
    try:
        group = TrajectoryGroup.model_validate(raw)
    except ValidationError as error:
        first = error.errors()[0]
        at = ".".join(str(part) for part in first.get("loc", ()))
        raise TrajectoryRefused(f"group {index} is malformed: {at + ': ' if at else ''}{first.get('msg')}") from None
    if len(group.trajectories) != group_size:
        raise TrajectoryRefused(
            f"group {index} (scenario {group.scenario_id!r}) has {len(group.trajectories)}"
            f" trajectories; this job's groups hold grpo.group_size = {group_size}"
        )
    return group


def _check_context(where: str, trajectory, tokenizer) -> None:
    """Each assistant turn's context, rendered as the trainer renders it, is the text of the prompt it was served for.

    Text, not token ids: a turn the model sampled in a non-canonical tokenisation is re-tokenised differently
    inside the next turn's prompt, and that honest trajectory must not be refused.
    """
    try:
        rendered = template_messages(trajectory.messages, trajectory.tools)
    except ValueError as error:  # a tool call whose arguments are not JSON cannot be rendered
        raise TrajectoryRefused(f"{where}: {error}") from None
    shift = len(rendered) - len(trajectory.messages)  # 1 when a system message was added for the tools
    for number, (m, message) in enumerate(trajectory.trained_turns()):
        expected = tokenizer.apply_chat_template(rendered[: m + shift], tokenize=False, add_generation_prompt=True)
        served = tokenizer.decode(
            message.sampled.prompt_token_ids, skip_special_tokens=False, clean_up_tokenization_spaces=False
        )
        if served != expected:
            raise TrajectoryRefused(
                f"{where}, assistant turn {number} (message {m}): the conversation before it differs from the prompt"
                " the endpoint served (edited messages or tools); submit the messages exactly as sent"
            )
