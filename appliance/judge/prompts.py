"""The judge's default rubrics and the chat messages it is sent.

A job's `judge.rubric` replaces only the grading criteria; the answer format
(JSON, 0-10 scores, which ids) is always appended here, so a custom rubric
cannot break parsing. Scores are asked on 0-10 in both modes and normalised to
0..1 by `parse.py`.
"""

from __future__ import annotations

DEFAULT_POINTWISE_RUBRIC = (
    "Grade the response to the question. Give 10 for a correct, complete and concise answer, "
    "around 5 for a partly correct answer or a correct answer with poor reasoning, and 0 for a "
    "wrong, off-topic or empty answer. If a reference answer is given, a response whose final "
    "answer disagrees with it scores at most 2."
)

DEFAULT_GROUP_RUBRIC = (
    "Several responses to the same question follow. Score each one from 0 to 10 relative to the "
    "others: the most correct and helpful response scores highest, wrong or off-topic ones score "
    "low, and only equally good responses get equal scores. If a reference answer is given, "
    "responses that agree with it beat responses that do not."
)

SYSTEM_PROMPT = "You are a careful, strict grader. You answer with a single JSON object and nothing else."

POINTWISE_FORMAT = 'Reply with only this JSON object: {"score": <integer from 0 to 10>, "reason": "<one short sentence>"}'


# The judge's answer is started for it: the prompt ends with the opening of the
# JSON, so even a small model continues with a score instead of answering the
# question itself (measured on SmolLM2-135M: 13 of 16 pointwise answers had no
# JSON without it). The parsers read prefill + generated text.
POINTWISE_PREFILL = '{"score": '
GROUP_PREFILL = '{"scores": [{"id": "1", "score": '


def group_format(ids: list[str]) -> str:
    example = ", ".join(f'{{"id": "{i}", "score": <0-10>, "explanation": "<short>"}}' for i in ids[:2])
    more = ", ..." if len(ids) > 2 else ""
    return (
        f'Reply with only this JSON object, one entry for each id {", ".join(ids)} and no other ids: '
        f'{{"scores": [{example}{more}]}}'
    )


def _question_block(question: str, reference: str | None) -> str:
    block = f"Question:\n{question.strip()}"
    if reference is not None and str(reference).strip():
        block += f"\n\nReference answer:\n{str(reference).strip()}"
    return block


def pointwise_messages(question: str, reference: str | None, response: str, rubric: str | None) -> list[dict[str, str]]:
    """The chat for judging one response on its own."""
    user = (
        f"{(rubric or DEFAULT_POINTWISE_RUBRIC).strip()}\n\n"
        f"{_question_block(question, reference)}\n\n"
        f"Response to grade:\n{response.strip()}\n\n"
        f"{POINTWISE_FORMAT}"
    )
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]


def _escape_tags(text: str) -> str:
    # A completion must not be able to close its own block and open a fake one.
    return text.replace("<response", "&lt;response").replace("</response", "&lt;/response")


def group_ids(count: int) -> list[str]:
    return [str(i) for i in range(1, count + 1)]


def group_messages(question: str, reference: str | None, responses: list[str], rubric: str | None) -> list[dict[str, str]]:
    """The chat for judging a whole group at once (RULER-style): the prompt once, then each response by id."""
    ids = group_ids(len(responses))
    blocks = "\n".join(
        f'<response id="{i}">\n{_escape_tags(text.strip())}\n</response>' for i, text in zip(ids, responses)
    )
    user = (
        f"{(rubric or DEFAULT_GROUP_RUBRIC).strip()}\n\n"
        f"{_question_block(question, reference)}\n\n"
        f"{blocks}\n\n"
        f"{group_format(ids)}"
    )
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]


# Earlier answers are cut to this many characters in a retry, so a runaway answer does not crowd the prompt.
RETRY_ECHO_CHARS = 600


def retry_messages(messages: list[dict[str, str]], previous_answer: str, problem: str) -> list[dict[str, str]]:
    """The same chat, followed by the unusable answer and what was wrong with it."""
    return messages + [
        {"role": "assistant", "content": previous_answer[:RETRY_ECHO_CHARS]},
        {"role": "user", "content": f"That answer could not be used: {problem}. "
                                    "Answer again with only the JSON object in the format asked, and nothing else."},
    ]
