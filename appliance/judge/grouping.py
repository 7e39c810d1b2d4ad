"""Which texts a group-mode judge reads, and in which orders.

A group's responses are judged once per distinct text, distinct after the
fold and whitespace normalisation (rewards/fold.py `normalised`: "9*5=45" and
"9 * 5 = 45 " are one response, judged once, with one score). A judge model
reading a list is swayed by where a response stands in it, so each group is
read in `judge.group_orders` orders (default 4): an order and its reversal (a
bias that grows or shrinks along the list cancels), then the order rotated by
half the group and its reversal (a bias for both ends, or the middle, cancels
too; with four responses each stands once at every place), and a response's
score is the mean of its readings. The orders of one group share the prompt's
prefix up to the first response.
The first order is shuffled from the job's seed and the set of texts, never
from where the sampler put them, so a response's place carries no signal and a
repeated group hits the cache.
When the task's reference holds a number, each score is read after the
reference's own entry at the top score and the response's final answer beside
it (`reference_anchor`, prompts.py `anchored_item_prefill`): a small judge
reading a list otherwise ranks by surface and barely by agreement with the
reference (bench/README.md, "Group mode").
"""

from __future__ import annotations

import random
from typing import Sequence

from appliance.judge.cache import cache_key
from appliance.judge.prompts import ReferenceAnchor
from appliance.rewards.extract import extract_answer, extract_value, format_number
from appliance.rewards.fold import normalised


def distinct(texts: Sequence[str], indices: Sequence[int]) -> dict[str, list[int]]:
    """The normalised text of each distinct response -> the indices (into `texts`) that share it, in order."""
    by_key: dict[str, list[int]] = {}
    for index in indices:
        by_key.setdefault(normalised(texts[index]), []).append(index)
    return by_key


def orders(
    members: dict[str, list[int]], seed: int, prompt: str, reference: str | None, count: int = 2
) -> list[list[list[int]]]:
    """The orders a group is read in (each a list of shared index lists), at most `count` distinct ones: the
    seeded shuffle and its reversal, then rotations of it (by a whole share of the group each) and theirs, so
    that every response stands at positions spread over the whole list."""
    keys = sorted(members)
    random.Random(cache_key("order", seed, prompt, reference, keys)).shuffle(keys)
    first = [members[key] for key in keys]
    found: list[list[list[int]]] = []
    rotations = max(count // 2, 1)
    for turn in range(rotations):
        shift = turn * len(first) // rotations
        rotated = first[shift:] + first[:shift]
        for order in (rotated, rotated[::-1]):
            if order not in found and len(found) < count:
                found.append(order)
    return found


def reference_anchor(reference: str | None, completions: Sequence[str]) -> ReferenceAnchor | None:
    """The anchor a group is read with: the reference's value and each response's final answer, as the
    correctness rule reads them; None when the reference holds no number (the group is read without one)."""
    value = extract_value(reference)
    if value is None:
        return None
    return ReferenceAnchor(format_number(value), tuple(extract_answer(text) or "" for text in completions))
