"""builtin:email_search, ART's email agent in small: find the one email that answers a question.

The mailbox comes from `mailbox.generate_mailbox(seed)`; each question has
exactly one right email. Tools: `search(keywords)` lists the best-matching
emails (id, date, sender, subject), `read(message_id)` shows one, and
`answer(answer, message_id)` ends the episode. Questions are split into train
and held-out once, by a fixed seed.

Reward: 1 for citing the right email, +0.5 when the answer states the fact (its words, in a short answer),
-0.05 for each tool call after the third (few steps win), -0.25 for each
malformed or refused call; an episode that never answers scores at most 0.

`worked_examples: N` (an environment option, default 0) shows N whole episodes
(search, read, answer, with the mailbox's real tool results) before the question,
as context, never trained; their questions leave the training split.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass

from appliance.agents.environment import AgentEnvironmentError, Episode, Scenario, Split, ToolEnvironment, ToolResult
from appliance.agents.envs.mailbox import Email, Question, generate_mailbox
from appliance.agents.toolcalls import format_call, function_tool
from appliance.agents.trajectory import AssistantMessage, FunctionCall, Message, ToolCall, ToolMessage, UserMessage

_WORD = re.compile(r"[a-z0-9]+")
SEARCH_RESULTS = 5  # a short list a small model can read in one tool message


@dataclass
class SearchState:
    email_id: str
    answer: str
    cited: str | None = None
    answered: str | None = None


# An answer may put the fact in a short sentence; one this many words longer than the fact is a dump, not an answer.
ANSWER_SLACK_WORDS = 8


def states_fact(answer: str, fact: str) -> bool:
    """True when `answer` states `fact`: its words in order as whole words, in an answer not much longer than it.

    Not a substring test: "12" is not in "123", and an answer listing every date of the mailbox does not pass.
    """
    said, wanted = _WORD.findall(answer.lower()), _WORD.findall(fact.lower())
    if not wanted or len(said) > len(wanted) + ANSWER_SLACK_WORDS:
        return False
    return any(said[start : start + len(wanted)] == wanted for start in range(len(said) - len(wanted) + 1))


class EmailSearchEnvironment(ToolEnvironment):
    name = "email_search"
    max_turns = 6
    # environment_options each takes, and its bounds (checked at admission, before the class builds anything).
    option_bounds = {
        "mailbox_seed": (0, 2**32 - 1),
        "mailbox_size": (1, 2000),
        "held_out_fraction": (0.0, 1.0),
        "worked_examples": (0, 8),
    }

    def __init__(
        self, mailbox_seed: int = 0, mailbox_size: int = 60, held_out_fraction: float = 0.25, worked_examples: int = 0
    ):
        emails, questions = generate_mailbox(mailbox_seed, mailbox_size)
        self.emails = {email.id: email for email in emails}
        shuffled = list(questions)
        # A fixed seed, not the job's: the split is a property of the mailbox, the same in every job.
        random.Random(1234).shuffle(shuffled)
        cut = max(1, round(len(shuffled) * held_out_fraction))
        if not 0 <= worked_examples <= 3 or cut + worked_examples >= len(shuffled):
            raise AgentEnvironmentError(
                f"email_search worked_examples must be 0 to 3 and leave training questions, not {worked_examples}"
            )
        self._example_questions = shuffled[cut : cut + worked_examples]
        self._splits = {"held_out": shuffled[:cut], "train": shuffled[cut + worked_examples :]}

    def tools(self) -> list[dict]:
        text = {"type": "string"}
        return [
            function_tool(
                "search",
                "Search the mailbox; returns matching emails as 'id | date | from | subject'.",
                {"keywords": text},
            ),
            function_tool("read", "Show the full email with this id.", {"message_id": text}),
            function_tool(
                "answer",
                "Give the final answer and the id of the email it comes from.",
                {"answer": text, "message_id": text},
            ),
        ]

    def scenarios(self, split: Split, count: int, seed: int) -> list[Scenario]:
        pool = self._splits[split]
        chosen = random.Random(seed).sample(pool, min(count, len(pool)))
        return [
            Scenario(
                id=f"email-{q.email_id}", data={"question": q.question, "email_id": q.email_id, "answer": q.answer}
            )
            for q in chosen
        ]

    def start(self, scenario: Scenario) -> tuple[SearchState, str, str]:
        system = (
            "You answer questions about the user's mailbox. Search for emails, read the promising ones, "
            "then call answer with the answer and the id of the email it is in. Be quick."
        )
        return SearchState(scenario.data["email_id"], scenario.data["answer"]), system, scenario.data["question"]

    def examples(self, scenario: Scenario) -> list[Message]:
        return [message for question in self._example_questions for message in self._worked_episode(question)]

    def _worked_episode(self, question: Question) -> list[Message]:
        """search (the right email's subject), read it, answer: the calls and the tools' real replies."""
        email = self.emails[question.email_id]
        steps = [
            ("search", {"keywords": email.subject.lower()}),
            ("read", {"message_id": email.id}),
            ("answer", {"answer": question.answer, "message_id": email.id}),
        ]
        messages: list[Message] = [UserMessage(content=question.question)]
        state = SearchState(email.id, question.answer)
        for number, (name, arguments) in enumerate(steps):
            call = ToolCall(
                id=f"example_{email.id}_{number}", function=FunctionCall(name=name, arguments=json.dumps(arguments))
            )
            messages += [
                AssistantMessage(content=format_call(call)),
                ToolMessage(tool_call_id=call.id, content=self.call(state, name, arguments).content),
            ]
        return messages

    def search(self, keywords: str) -> list[Email]:
        words = set(_WORD.findall(keywords.lower()))
        scored = []
        for email in self.emails.values():
            text = set(_WORD.findall(f"{email.sender} {email.subject} {email.body}".lower()))
            hits = len(words & text)
            if hits:  # most shared words first, then by id: the same order on every run
                scored.append((-hits, email.id, email))
        return [email for _, _, email in sorted(scored)[:SEARCH_RESULTS]]

    def call(self, state: SearchState, name: str, arguments: dict) -> ToolResult:
        if name == "search":
            found = self.search(arguments["keywords"])
            return ToolResult("\n".join(email.header() for email in found) if found else "no emails match")
        if name == "read":
            email = self.emails.get(arguments["message_id"].strip())
            if email is None:
                return ToolResult(f"no email has id {arguments['message_id']!r}; ids look like m0012", error=True)
            return ToolResult(email.full())
        state.answered, state.cited = arguments["answer"], arguments["message_id"].strip()
        return ToolResult("answer recorded", done=True)

    def score(self, state: SearchState, episode: Episode) -> tuple[float, dict[str, float]]:
        right_email = state.cited == state.email_id
        has_fact = state.answered is not None and states_fact(state.answered, state.answer)
        reward = (
            float(right_email)
            + 0.5 * has_fact
            - 0.05 * max(0, episode.tool_calls - 3)
            - 0.25 * (episode.malformed_calls + episode.invalid_calls)
        )
        if state.answered is None:  # reading the right email is worth nothing without an answer
            reward = min(0.0, reward)
        return reward, {
            "right_email": float(right_email),
            "correct_answer": float(has_fact),
            "answered": float(state.answered is not None),
            "success": float(right_email),
        }
