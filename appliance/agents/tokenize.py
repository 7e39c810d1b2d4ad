"""A trajectory as training data: input ids, the assistant mask and the sampled logprobs.

The conversation is rendered with the model's own chat template (through
`toolcalls.template_messages`, the same text the model was prompted with) and
cut into segments by rendering growing prefixes: before assistant turn i the
template is rendered up to i with the generation prompt, and after it without.
What lies between is that turn; of it, the model's own text and the end-of-turn
token are trained (mask 1) and the template's glue around it is context, as
are system, user and tool segments.
"""

from __future__ import annotations

from dataclasses import dataclass

from appliance.agents.toolcalls import template_messages
from appliance.agents.trajectory import AssistantMessage, Trajectory
from appliance.errors import ApplianceError


class TemplateError(ApplianceError):
    """The chat template does not render a conversation as a sequence of growing prefixes."""


@dataclass
class TokenizedTrajectory:
    """One trajectory as the trainer consumes it; all lists have the same length."""

    input_ids: list[int]
    assistant_mask: list[int]  # 1 where the token is trained
    # Sampling logprob of each trained token that an engine produced; None for context and unsampled turns.
    logprobs: list[float | None]
    drifted_turns: int = 0
    context_mismatches: int = 0

    @property
    def trained_tokens(self) -> int:
        return sum(self.assistant_mask)

    @property
    def context_tokens(self) -> int:
        return len(self.input_ids) - self.trained_tokens


def _render(tokenizer, messages: list[dict[str, str]], generation_prompt: bool) -> str:
    if not messages:
        return ""
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)


def _encode(tokenizer, text: str) -> list[int]:
    # The rendered template already holds its special tokens (BOS included) as text.
    return tokenizer(text, add_special_tokens=False)["input_ids"] if text else []


def _decode(tokenizer, ids: list[int]) -> str:
    # Exactly the text the ids stand for: no special tokens dropped, no spaces tidied.
    return tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


def _after(longer: str, prefix: str, what: str) -> str:
    if not longer.startswith(prefix):
        raise TemplateError(
            f"the chat template does not render {what} as an extension of the conversation before it,"
            " so the assistant tokens cannot be located; use a model whose template renders turns in order"
        )
    return longer[len(prefix) :]


def tokenize_trajectory(tokenizer, trajectory: Trajectory) -> TokenizedTrajectory:
    """Input ids, assistant mask and logprobs of `trajectory` under `tokenizer`'s chat template.

    Each segment is tokenised on its own, except that an assistant turn an engine produced keeps the token ids it
    sampled, verbatim, with their logprobs. When re-tokenising such a turn's text gives other ids (a non-canonical
    tokenisation was sampled), the sampled ids are kept and the turn counts in `drifted_turns`. When the client
    recorded each turn's prompt ids, the context before the turn is those served ids, and `context_mismatches`
    counts the turns whose earlier tokens differ from that prompt: "trains exactly as it was generated" is
    checked rather than assumed.
    """
    rendered = template_messages(trajectory.messages, trajectory.tools)
    shift = len(rendered) - len(trajectory.messages)  # 1 when a system message was added for the tools
    out = TokenizedTrajectory(input_ids=[], assistant_mask=[], logprobs=[])
    eos = tokenizer.eos_token or ""
    covered = ""  # the rendered text accounted for so far

    def add_context(text: str) -> None:
        ids = _encode(tokenizer, text)
        out.input_ids += ids
        out.assistant_mask += [0] * len(ids)
        out.logprobs += [None] * len(ids)

    # Everything else (worked examples included) is context, rendered into the next trained turn's prompt.
    for index, message in trajectory.trained_turns():
        position = index + shift
        prompt = _render(tokenizer, rendered[:position], generation_prompt=True)
        before = len(out.input_ids)
        segment = _after(prompt, covered, f"message {index}'s generation prompt")
        add_context(segment)
        turn_text = _after(
            _render(tokenizer, rendered[: position + 1], generation_prompt=False), prompt, f"assistant message {index}"
        )
        content = rendered[position]["content"]
        if not turn_text.startswith(content):
            raise TemplateError(
                f"the chat template changes the text of assistant message {index}; "
                "its tokens cannot be matched to what the model wrote"
            )
        rest = turn_text[len(content) :]
        # The prompt the endpoint served this turn for is the truth where the client recorded it.
        served = message.sampled.prompt_token_ids if message.sampled is not None else None
        if served is not None and out.input_ids != served:
            if served[:before] == out.input_ids[:before] and _decode(tokenizer, served[before:]) == segment:
                # The same text tokenised otherwise (a merge across a segment boundary): train on the served ids.
                del out.input_ids[before:], out.assistant_mask[before:], out.logprobs[before:]
                out.input_ids += served[before:]
                out.assistant_mask += [0] * (len(served) - before)
                out.logprobs += [None] * (len(served) - before)
            else:
                out.context_mismatches += 1
        trained, glue = _trained_tokens(tokenizer, message, content, rest, eos, out)
        out.input_ids += trained
        out.assistant_mask += [1] * len(trained)
        add_context(glue)
        covered = prompt + turn_text
    add_context(_after(_render(tokenizer, rendered, generation_prompt=False), covered, "the last message"))
    return out


def _trained_tokens(
    tokenizer, message: AssistantMessage, content: str, rest: str, eos: str, out: TokenizedTrajectory
) -> tuple[list[int], str]:
    """The ids of the turn the model produced (appending their logprobs to `out`) and the template glue after."""
    ends_with_eos = bool(eos) and rest.startswith(eos)
    if message.sampled is None:  # a turn no engine produced (e.g. written by hand): tokenised, no logprobs
        ids = _encode(tokenizer, content + (eos if ends_with_eos else ""))
        out.logprobs += [None] * len(ids)
        return ids, rest[len(eos) :] if ends_with_eos else rest
    sampled = message.sampled
    stopped = bool(sampled.token_ids) and sampled.token_ids[-1] == tokenizer.eos_token_id
    # Counted, not refused: the sampled ids are what the model produced, and they train as sampled.
    if _encode(tokenizer, content + (eos if stopped else "")) != sampled.token_ids:
        out.drifted_turns += 1
    out.logprobs += list(sampled.logprobs)
    # A turn cut off by the length limit has no end-of-turn token of its own: the template's is context.
    glue = rest[len(eos) :] if stopped and ends_with_eos else rest
    return list(sampled.token_ids), glue
