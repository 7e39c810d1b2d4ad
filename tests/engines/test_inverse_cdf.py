"""Sampling by inverse CDF draws from the policy's distribution, as torch.multinomial does, and faster."""

from __future__ import annotations

import math
import time

import torch

from appliance.engines.base import Sampling
from appliance.engines.hf import HFEngine
from appliance.engines.inverse_cdf import InverseCdfSampler, draw, sampling_processors


def test_draws_follow_the_distribution_and_never_pick_a_token_of_probability_zero():
    # 1,000 tokens: blocks of 256 with the last one partial, mass at both edges of a block, empty blocks.
    torch.manual_seed(0)
    probabilities = torch.zeros(1000)
    probabilities[[255, 256, 511, 700, 701, 999]] = torch.tensor([0.3, 0.2, 0.1, 0.2, 0.05, 0.15])
    scores = probabilities.log().expand(8, -1).contiguous()  # -inf where the probability is 0
    draws = 80_000
    counts = torch.zeros(1000)
    for _ in range(draws // 8):
        counts += torch.bincount(draw(scores), minlength=1000)
    assert counts[probabilities == 0].sum() == 0
    for token in torch.nonzero(probabilities).flatten().tolist():
        p = float(probabilities[token])
        sigma = math.sqrt(draws * p * (1 - p))
        assert abs(float(counts[token]) - draws * p) < 5 * sigma, (token, counts[token])


def test_a_smooth_distribution_over_a_real_vocabulary_matches_its_block_masses():
    torch.manual_seed(2)
    scores = torch.randn(1, 49152) * 2
    probabilities = torch.softmax(scores, dim=-1)[0]
    drawn = torch.cat([draw(scores.expand(64, -1)) for _ in range(500)])
    # Per 4,096-token span: the share drawn against the probability mass, within 5 sigma.
    spans = probabilities.view(12, 4096).sum(dim=-1)
    counts = torch.bincount(drawn // 4096, minlength=12).float()
    sigma = (len(drawn) * spans * (1 - spans)).sqrt()
    assert ((counts - len(drawn) * spans).abs() < 5 * sigma).all()


def test_all_mass_on_the_last_token_is_drawn_there():
    scores = torch.full((3, 1000), float("-inf"))
    scores[:, -1] = 0.0
    assert draw(scores).tolist() == [999, 999, 999]


def test_the_sampler_keeps_the_scores_it_drew_from_and_makes_its_draw_the_argmax():
    torch.manual_seed(1)
    processors, sampler = sampling_processors(temperature=0.7, top_p=0.9)
    raw = torch.randn(5, 300) * 3
    out = processors(torch.zeros((5, 1), dtype=torch.long), raw.clone())
    [kept] = sampler.scores
    assert torch.isinf(kept).any() and torch.allclose(kept[torch.isfinite(kept)], (raw / 0.7)[torch.isfinite(kept)])
    drawn = out.argmax(dim=-1)
    assert torch.isfinite(kept.gather(1, drawn[:, None])).all()  # inside the nucleus
    assert isinstance(processors[-1], InverseCdfSampler)


def test_a_draw_is_many_times_cheaper_than_multinomial_at_a_real_vocabulary():
    scores = torch.randn(16, 49152) * 3
    probabilities = torch.softmax(scores, dim=-1)

    def seconds(function) -> float:
        function()
        started = time.perf_counter()
        for _ in range(20):
            function()
        return time.perf_counter() - started

    assert seconds(lambda: draw(scores)) * 4 < seconds(lambda: torch.multinomial(probabilities, 1))


def test_the_engine_samples_reproducibly_by_seed_with_the_logprobs_of_what_it_drew(demo_model_dir):
    engine = HFEngine.load(demo_model_dir, name="plain")
    prompt = engine.render_chat([{"role": "user", "content": "Name a colour."}])
    sampling = Sampling(max_new_tokens=6, n=4, temperature=1.0, seed=3)
    first, again = engine.generate([prompt], sampling)[0], engine.generate([prompt], sampling)[0]
    assert [c.token_ids for c in first] == [c.token_ids for c in again]
    assert len({tuple(c.token_ids) for c in first}) > 1  # sampled, not greedy
    # Each logprob is the model's own log-softmax at that step (temperature 1, top-p 1).
    completion = first[0]
    ids = torch.tensor([completion.prompt_token_ids + completion.token_ids])
    with torch.no_grad():
        logits = engine.model(ids).logits[0, len(completion.prompt_token_ids) - 1 : -1].float()
    expected = torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(completion.token_ids)[:, None]).squeeze(1)
    assert torch.allclose(torch.tensor(completion.logprobs), expected, atol=1e-4)
