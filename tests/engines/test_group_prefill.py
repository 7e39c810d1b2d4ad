"""Prompt prefills are shared in the transformers engine (a group's prompt, a batch's common prefix), same samples."""

from __future__ import annotations

import pytest
import torch

from appliance.engines import hf
from appliance.engines.engine import Sampling
from appliance.engines.hf import HFEngine, group_batches
from appliance.engines.scoring import shared_prefix_length

PROMPTS = ["What is 7 * 8? Answer with one number.", "Name a colour."]  # different lengths: left padding


def test_batches_hold_whole_groups_and_split_only_a_group_larger_than_a_batch():
    prompts = list(enumerate("abcde"))
    assert group_batches(prompts, 4, 8) == [(prompts[0:2], 4), (prompts[2:4], 4), (prompts[4:5], 4)]
    assert group_batches(prompts[:2], 1, 64) == [(prompts[:2], 1)]
    # 20 completions at most 8 a batch: 8 + 8 + 4 per prompt, each batch prefills its one prompt once
    assert group_batches(prompts[:2], 20, 8) == [([prompts[0]], 8), ([prompts[0]], 8), ([prompts[0]], 4)] + [
        ([prompts[1]], 8),
        ([prompts[1]], 8),
        ([prompts[1]], 4),
    ]


class ForwardLog:
    """Every forward of the real model: (rows, tokens) of its input_ids."""

    def __init__(self, model: torch.nn.Module):
        self.calls: list[tuple[int, int]] = []
        self._handle = model.register_forward_pre_hook(self._record, with_kwargs=True)

    def _record(self, module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        self.calls.append(tuple(ids.shape))

    def prefilled_rows(self) -> int:
        """Rows that ran more than one token: prompt prefills (a decode step runs one token a row)."""
        return sum(rows for rows, tokens in self.calls if tokens > 1)

    def close(self) -> None:
        self._handle.remove()


def _generate(engine: HFEngine, prompts: list[str], sampling: Sampling):
    log = ForwardLog(engine.model)
    try:
        return engine.generate(prompts, sampling), log
    finally:
        log.close()


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_group_prefills_its_prompt_once_and_samples_as_a_prefill_per_completion(tiny_engine, temperature):
    sampling = Sampling(max_new_tokens=8, n=4, temperature=temperature, top_p=1.0, seed=3)
    shared, log = _generate(tiny_engine, PROMPTS, sampling)
    assert log.prefilled_rows() == len(PROMPTS)  # not len(PROMPTS) * 4
    assert all(tokens == 1 for _, tokens in log.calls[1:])  # after the one prefill, one token a row a step
    assert [len(group) for group in shared] == [4, 4]

    # The same completions, one prompt per completion (n=1, each prompt four times: the engine's former path).
    per_completion = Sampling(max_new_tokens=8, n=1, temperature=temperature, top_p=1.0, seed=3)
    plain, plain_log = _generate(tiny_engine, [p for p in PROMPTS for _ in range(4)], per_completion)
    assert plain_log.prefilled_rows() == len(PROMPTS) * 4
    plain_flat = [group[0] for group in plain]
    shared_flat = [c for group in shared for c in group]
    assert [c.token_ids for c in shared_flat] == [c.token_ids for c in plain_flat]
    assert [c.prompt_token_ids for c in shared_flat] == [c.prompt_token_ids for c in plain_flat]
    for got, want in zip(shared_flat, plain_flat):
        torch.testing.assert_close(torch.tensor(got.logprobs), torch.tensor(want.logprobs), rtol=1e-4, atol=1e-4)


def test_one_token_prompts_and_single_completions_take_the_plain_path(tiny_engine):
    bos = tiny_engine.tokenizer.decode([tiny_engine.tokenizer.eos_token_id])
    groups, log = _generate(tiny_engine, [bos], Sampling(max_new_tokens=3, n=3, temperature=1.0, seed=0))
    assert [len(group) for group in groups] == [3] and log.calls[0] == (3, 1)


# An agent's turns: one long system text (tools, worked episodes) and conversations that differ after it.
SYSTEM = "You are a careful assistant. Call the multiply tool, then copy its result into answer tags. " * 3
CONVERSATIONS = [SYSTEM + "What is 12 * 31?", SYSTEM + "What is 7 * 5? Show the call.", SYSTEM + "Name a colour."]


@pytest.mark.parametrize("n", [1, 3])
def test_prompts_sharing_a_long_prefix_run_it_once_and_sample_as_without_sharing(tiny_engine, monkeypatch, n):
    sampling = Sampling(max_new_tokens=6, n=n, temperature=1.0, top_p=1.0, seed=5)
    ids = [tiny_engine._encode(prompt) for prompt in CONVERSATIONS]
    prefix = shared_prefix_length(ids)
    assert prefix >= hf.MIN_SHARED_PREFIX_TOKENS
    shared, log = _generate(tiny_engine, CONVERSATIONS, sampling)
    # The prefix once (one row), then each prompt's own tokens once (not n times), then one token a row a step.
    assert log.calls[0] == (1, prefix)
    assert log.calls[1] == (len(CONVERSATIONS), max(len(row) for row in ids) - prefix - 1)
    assert all(tokens == 1 for _, tokens in log.calls[2:])
    prefilled_tokens = sum(rows * tokens for rows, tokens in log.calls[:2])

    monkeypatch.setattr(hf, "MIN_SHARED_PREFIX_TOKENS", 10**9)  # the engine without prefix sharing
    plain, plain_log = _generate(tiny_engine, CONVERSATIONS, sampling)
    plain_prefilled = sum(rows * tokens for rows, tokens in plain_log.calls if tokens > 1)
    assert prefilled_tokens < plain_prefilled / 2
    shared_flat = [c for group in shared for c in group]
    plain_flat = [c for group in plain for c in group]
    assert [c.prompt_token_ids for c in shared_flat] == [c.prompt_token_ids for c in plain_flat]
    assert [c.prompt_token_ids for c in shared_flat] == [row for row in ids for _ in range(n)]
    assert [c.token_ids for c in shared_flat] == [c.token_ids for c in plain_flat]
    for got, want in zip(shared_flat, plain_flat):
        torch.testing.assert_close(torch.tensor(got.logprobs), torch.tensor(want.logprobs), rtol=1e-4, atol=1e-4)


def test_the_lm_head_gets_contiguous_input_hooked_once_per_model(demo_model_dir):
    # transformers hands the head the prefill's last position as a strided view, for which torch's CPU matmul
    # expands the frozen weight per row (hf._contiguous_input). Every engine over the same weights (the
    # evaluation makes one per run) shares one hook.
    engine = HFEngine.load(demo_model_dir, name="plain")
    HFEngine(engine.model, engine.tokenizer, name="second")
    head = engine.model.get_output_embeddings()
    assert len(head._forward_pre_hooks) == 1
    contiguous = []
    head.register_forward_hook(lambda module, args, output: contiguous.append(args[0].is_contiguous()))
    prompts = [engine.render_chat([{"role": "user", "content": p}]) for p in PROMPTS]
    engine.generate(prompts, Sampling(max_new_tokens=2, n=2, temperature=0.0))
    assert len(contiguous) >= 2 and all(contiguous)
