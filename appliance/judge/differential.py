"""The differential check: text outside a response's answer and working cannot raise its judge reward.

The injection guard names what it stops; this check names nothing. A response
to a task with a numeric answer has an answer span (rewards/extract.py
`answer_core`: the span the rule rewards read the answer from, and the task's
`<reasoning>` block when one opens before it). The judge scores the response
as written ("full") and its core alone ("core": the text outside cut away), and
the reward is the lower of the two when they differ by more than
`judge.differential_threshold`. Whatever a student appends after its answer,
in whatever spelling or language, can then lower its reward but never raise
it by more than the threshold. A response whose text is all core (it ends at
its answer) costs nothing extra; the core's reading is its own pointwise
prompt (the same question, so the prompt's prefix is shared) and is cached
like any response's. In group mode the whole group is read a second time with
every response cut to its core, so that each core is judged beside its peers'.
Tasks without a numeric reference (agent transcripts, open questions) have no
answer span, and the check leaves them to the guard.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Hashable, Literal, Sequence

from appliance.rewards.extract import answer_core, extract_value

if TYPE_CHECKING:
    from appliance.rewards.registry import RewardSample

View = Literal["full", "core"]


@dataclass(frozen=True)
class Item:
    """One text the judge reads for a sample: the response as written, or its core."""

    sample: int
    view: View
    text: str


def core_text(sample: "RewardSample") -> str | None:
    """The sample's answer and working when the task has a numeric reference and the response holds an answer."""
    if sample.reference is None or extract_value(sample.reference) is None:
        return None
    return answer_core(sample.completion)


def judged_items(
    samples: Sequence["RewardSample"], group_keys: Sequence[Hashable], mode: str, threshold: float | None
) -> list[Item]:
    """Every text to judge: each response, then the cores. Pointwise: the core of each response with text
    outside it. Group: when any member of a group has such text, the core of every member (its peers' cores
    are the group it is read in)."""
    items = [Item(index, "full", sample.completion) for index, sample in enumerate(samples)]
    if threshold is None:
        return items
    cores = [core_text(sample) for sample in samples]
    tailed = [core is not None and core.strip() != sample.completion.strip() for core, sample in zip(cores, samples)]
    if mode == "group":
        groups_with_tails = {key for key, has_tail in zip(group_keys, tailed) if has_tail}
        wanted = [key in groups_with_tails for key in group_keys]
    else:
        wanted = tailed
    for index, (sample, core) in enumerate(zip(samples, cores)):
        if wanted[index]:
            items.append(Item(index, "core", core if tailed[index] else sample.completion))
    return items


def combine(
    items: Sequence[Item], scores: Sequence[float | None], count: int, threshold: float | None
) -> tuple[list[float | None], list[bool]]:
    """Per sample: its reward (the full reading, or the core's when the full one is higher by more than the
    threshold) and whether the core's was taken. A failed core reading leaves the full one."""
    full: list[float | None] = [None] * count
    core: list[float | None] = [None] * count
    tailed = [False] * count
    texts = {item.sample: item.text for item in items if item.view == "full"}
    for item, score in zip(items, scores):
        if item.view == "full":
            full[item.sample] = score
        else:
            core[item.sample] = score
            tailed[item.sample] = item.text != texts[item.sample]
    capped = [
        threshold is not None
        and tailed[i]
        and full[i] is not None
        and core[i] is not None
        and full[i] > core[i] + threshold
        for i in range(count)
    ]
    return [core[i] if capped[i] else full[i] for i in range(count)], capped
