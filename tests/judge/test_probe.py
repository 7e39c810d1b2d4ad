"""The load probe: a judge that puts too little probability on the score tokens refuses to start, with the reason.

The judge models here are tiny Llamas with the bundled tokenizer whose weights
are set by hand (a "bigram" model: every layer's output projection is zero, so
the next token depends only on the last one): after a space they put nearly all
mass on the digits, after `":` on a space. Served through the appliance's own
OpenAI-compatible server with a Llama-3-style chat template that trims each
message, the `{"score": ` opening loses its space, and the probe catches it; the
same model loaded locally (which appends the opening itself) passes.
"""

from __future__ import annotations

import shutil

import pytest

from appliance.config.schema import JudgeSpec
from appliance.judge import Judge
from appliance.judge.probe import JudgeProbeError

pytestmark = pytest.mark.model

TRIMMING_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] | trim "
    "+ '<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def bigram_judge(source, target, template: str | None = None):
    """A tiny Llama that scores after a space (mostly 7) and answers a space after '":'."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(source)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    space, colon = tokenizer.convert_tokens_to_ids(["Ġ", '":'])
    digits = tokenizer.convert_tokens_to_ids([str(d) for d in range(10)])
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        embed, head = model.model.embed_tokens.weight, model.lm_head.weight
        embed[space] = 0
        embed[space, 0] = 1.0
        embed[colon] = 0
        embed[colon, 1] = 1.0
        for digit in digits:
            head[digit] = 0
            head[digit, 0] = 4.0
        head[digits[7], 0] = 4.3
        head[space] = 0
        head[space, 1] = 4.0
    model.save_pretrained(target)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (source / name).is_file():
            shutil.copy(source / name, target / name)
    if template is not None:
        (target / "chat_template.jinja").write_text(template)
    return target


@pytest.fixture(scope="module")
def trimming_judge_dir(demo_model_dir, tmp_path_factory):
    return bigram_judge(demo_model_dir, tmp_path_factory.mktemp("bigram-trim"), TRIMMING_TEMPLATE)


@pytest.fixture(scope="module")
def keeping_judge_dir(demo_model_dir, tmp_path_factory):
    return bigram_judge(demo_model_dir, tmp_path_factory.mktemp("bigram-keep"))


def remote_judge(model_dir):
    from appliance.engines.hf import HFEngine
    from appliance.engines.openai_remote import OpenAIRemoteEngine
    from appliance.engines.openai_server import serve_in_thread

    local = HFEngine.load(model_dir, device="cpu", name="judge")
    server = serve_in_thread(local)
    remote = OpenAIRemoteEngine(server.url, "judge", retries=0)
    return local, server, remote


@pytest.mark.parametrize("mode", ["pointwise", "group"])
def test_a_trimming_remote_template_is_refused_at_load(trimming_judge_dir, mode):
    local, server, remote = remote_judge(trimming_judge_dir)
    try:
        with pytest.raises(JudgeProbeError) as caught:
            Judge(JudgeSpec(model="judge", endpoint="http://127.0.0.1:1/v1", mode=mode), remote)
    finally:
        remote.close()
        server.close()
        local.close()
    message = str(caught.value)
    assert "below judge.min_score_mass 0.5" in message
    assert "most likely next tokens are ' '" in message and "trims the answer's opening" in message


def test_the_same_model_passes_where_the_opening_keeps_its_space(trimming_judge_dir, keeping_judge_dir):
    from appliance.engines.hf import HFEngine

    local = HFEngine.load(trimming_judge_dir, device="cpu")  # local rendering appends the opening itself
    try:
        judge = Judge(JudgeSpec(model="judge"), local)
        assert min(judge.probe.masses) > 0.99
    finally:
        local.close()
    local, server, remote = remote_judge(keeping_judge_dir)
    try:
        judge = Judge(JudgeSpec(model="judge", endpoint="http://127.0.0.1:1/v1", mode="group"), remote)
        assert min(judge.probe.masses) > 0.99 and judge.probe.scores[0] > 0.6  # leaning to 7, not uniform
    finally:
        remote.close()
        server.close()
        local.close()


def test_a_judge_that_ignores_the_format_is_refused_locally(tiny_engine):
    with pytest.raises(JudgeProbeError, match=r"puts 0\.\d+ of its next-token probability.*scoring: generate"):
        Judge(JudgeSpec(model="tiny"), tiny_engine)
    Judge(JudgeSpec(model="tiny", scoring="generate"), tiny_engine)  # generate mode reads no probabilities


def test_an_endpoint_that_does_not_answer_the_probe_is_refused():
    from appliance.engines.openai_remote import OpenAIRemoteEngine

    remote = OpenAIRemoteEngine("http://127.0.0.1:9/v1", "judge", retries=0, timeout_seconds=2)
    try:
        with pytest.raises(JudgeProbeError, match="did not answer the calibration prompt"):
            Judge(JudgeSpec(model="judge", endpoint="http://127.0.0.1:9/v1"), remote)
    finally:
        remote.close()


def test_a_transcript_longer_than_the_model_window_is_cut_and_scored(keeping_judge_dir):
    from appliance.engines.hf import HFEngine
    from appliance.rewards.registry import RewardSample

    local = HFEngine.load(keeping_judge_dir, device="cpu")  # max_position_embeddings 4096
    try:
        # Without the differential check: the transcript's core (its first line) would be a short request of its own.
        judge = Judge(JudgeSpec(model="judge", mode="group", differential_threshold=None), local)
        transcript = "call calculator(2, 3)\nresult: 5\n" * 2_000
        samples = [RewardSample("Add.", transcript, "5", 0), RewardSample("Add.", "<answer>5</answer>", "5", 0)]
        scores = judge(samples)
        assert (
            judge.window == 4096
            and judge.stats()["prompts_cut"] == judge.stats()["requests"] == 2
            and not any(judge.last_failed)
        )
        assert all(0.0 <= score <= 1.0 for score in scores)
    finally:
        local.close()


def test_chat_template_kwargs_reach_a_local_template_and_an_endpoint(demo_model_dir, tmp_path):
    from appliance.engines.hf import HFEngine
    from appliance.engines.openai_remote import OpenAIRemoteEngine

    thinking = "{{ 'THINKING OFF ' if enable_thinking is defined and not enable_thinking else '' }}"
    target = bigram_judge(demo_model_dir, tmp_path / "m", thinking + TRIMMING_TEMPLATE)
    local = HFEngine.load(target, device="cpu")
    try:
        judge = Judge(JudgeSpec(model="j", chat_template_kwargs={"enable_thinking": False}), local)
        assert judge.engine.render_chat([{"role": "user", "content": "x"}]).startswith("THINKING OFF")
    finally:
        local.close()
    spec = JudgeSpec(model="j", endpoint="http://127.0.0.1:9/v1", chat_template_kwargs={"enable_thinking": False})
    remote = OpenAIRemoteEngine.from_judge_spec(spec)
    try:
        body = remote._body(remote.render_chat([{"role": "user", "content": "x"}]) + '{"score": ', _sampling())
        assert body["chat_template_kwargs"] == {"enable_thinking": False} and body["continue_final_message"]
    finally:
        remote.close()


def _sampling():
    from appliance.engines.engine import Sampling

    return Sampling(max_new_tokens=1, temperature=0.0)
