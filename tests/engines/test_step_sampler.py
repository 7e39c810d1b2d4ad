"""The transformers engine's token choice: draws follow the policy (by inverse CDF, faster than multinomial),
greedy picks the argmax, and each chosen token's logprob is the log-softmax of the scores it came from."""

from __future__ import annotations

import math
import time

import torch

from appliance.engines.engine import Sampling
from appliance.engines.hf import HFEngine
from appliance.engines.step_sampler import BLOCK_TOKENS, StepSampler, block_masses, draw, token_processors


def _draw_from_scores(scores: torch.Tensor) -> torch.Tensor:
    sampler = StepSampler(greedy=False)
    return sampler(torch.zeros((scores.shape[0], 1), dtype=torch.long), scores).argmax(dim=-1)


def test_draws_follow_the_distribution_and_never_pick_a_token_of_probability_zero():
    # 1,000 tokens: blocks of 256 with the last one partial, mass at both edges of a block, empty blocks.
    torch.manual_seed(0)
    probabilities = torch.zeros(1000)
    probabilities[[255, 256, 511, 700, 701, 999]] = torch.tensor([0.3, 0.2, 0.1, 0.2, 0.05, 0.15])
    scores = probabilities.log().expand(8, -1).contiguous()  # -inf where the probability is 0
    draws = 80_000
    counts = torch.zeros(1000)
    for _ in range(draws // 8):
        counts += torch.bincount(_draw_from_scores(scores), minlength=1000)
    assert counts[probabilities == 0].sum() == 0
    for token in torch.nonzero(probabilities).flatten().tolist():
        p = float(probabilities[token])
        sigma = math.sqrt(draws * p * (1 - p))
        assert abs(float(counts[token]) - draws * p) < 5 * sigma, (token, counts[token])


def test_a_smooth_distribution_over_a_real_vocabulary_matches_its_span_masses():
    torch.manual_seed(2)
    scores = torch.randn(1, 49152) * 2
    probabilities = torch.softmax(scores, dim=-1)[0]
    drawn = torch.cat([_draw_from_scores(scores.expand(64, -1).contiguous()) for _ in range(500)])
    spans = probabilities.view(12, 4096).sum(dim=-1)
    counts = torch.bincount(drawn // 4096, minlength=12).float()
    sigma = (len(drawn) * spans * (1 - spans)).sqrt()
    assert ((counts - len(drawn) * spans).abs() < 5 * sigma).all()


def test_all_mass_on_the_last_token_is_drawn_there():
    scores = torch.full((3, 1000), float("-inf"))
    scores[:, -1] = 0.0
    assert _draw_from_scores(scores).tolist() == [999, 999, 999]


def test_logprobs_are_the_log_softmax_of_the_scores_drawn_from_over_several_steps():
    torch.manual_seed(3)
    processors, sampler = token_processors(temperature=0.7, top_p=0.9)
    ids = torch.zeros((5, 1), dtype=torch.long)
    raw_steps = [torch.randn(5, 1000) * 3 for _ in range(4)]
    tokens = [processors(ids, raw.clone()).argmax(dim=-1) for raw in raw_steps]
    logprobs = sampler.logprobs(5)
    assert logprobs.shape == (5, 4)
    for step, (raw, token) in enumerate(zip(raw_steps, tokens)):
        warped = processors[1](ids, processors[0](ids, raw.clone()))  # temperature, then top-p
        expected = torch.log_softmax(warped, dim=-1).gather(1, token[:, None]).squeeze(1)
        assert torch.isfinite(expected).all()  # drawn inside the nucleus
        assert torch.allclose(logprobs[:, step], expected, atol=1e-5)


def test_a_top_p_masked_score_gives_the_renormalised_probability():
    sampler = StepSampler(greedy=True)
    sampler(torch.zeros((1, 1), dtype=torch.long), torch.tensor([[0.0, 0.0, float("-inf"), float("-inf")]]))
    assert torch.allclose(sampler.logprobs(1), torch.tensor([[math.log(0.5)]]))


def test_greedy_keeps_the_scores_and_reads_the_argmax_logprob():
    sampler = StepSampler(greedy=True)
    scores = torch.tensor([[1.0, 3.0, 2.0], [0.5, 0.1, 0.2]])
    assert sampler(torch.zeros((2, 1), dtype=torch.long), scores) is scores
    expected = torch.log_softmax(scores, dim=-1).max(dim=-1).values
    assert torch.allclose(sampler.logprobs(2)[:, 0], expected, atol=1e-6)
    assert StepSampler(greedy=True).logprobs(2).shape == (2, 0)


def test_a_draw_is_many_times_cheaper_than_multinomial_at_a_real_vocabulary():
    scores = torch.randn(16, 49152) * 3
    probabilities = torch.softmax(scores, dim=-1)
    weights = torch.exp(scores - scores.max(dim=-1, keepdim=True).values)
    masses = block_masses(weights)
    assert weights.shape[1] % BLOCK_TOKENS == 0

    def seconds(function) -> float:
        function()
        started = time.perf_counter()
        for _ in range(20):
            function()
        return time.perf_counter() - started

    assert seconds(lambda: draw(weights, masses)) * 4 < seconds(lambda: torch.multinomial(probabilities, 1))


def test_the_engine_samples_reproducibly_by_seed_with_the_logprobs_of_what_it_drew(demo_model_dir):
    engine = HFEngine.load(demo_model_dir, name="plain")
    prompt = engine.render_chat([{"role": "user", "content": "Name a colour."}])
    sampling = Sampling(max_new_tokens=6, n=4, temperature=1.0, seed=3)
    first, again = engine.generate([prompt], sampling)[0], engine.generate([prompt], sampling)[0]
    assert [c.token_ids for c in first] == [c.token_ids for c in again]
    assert len({tuple(c.token_ids) for c in first}) > 1  # sampled, not greedy
    for completion in (*first, *engine.generate([prompt], Sampling(max_new_tokens=6, n=1, temperature=0.0))[0]):
        ids = torch.tensor([completion.prompt_token_ids + completion.token_ids])
        with torch.no_grad():
            logits = engine.model(ids).logits[0, len(completion.prompt_token_ids) - 1 : -1].float()
        expected = torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(completion.token_ids)[:, None])
        assert torch.allclose(torch.tensor(completion.logprobs), expected.squeeze(1), atol=1e-4)
