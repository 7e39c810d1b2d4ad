"""VLLMEngine's CUDA-only memory choreography, against a recording fake of vllm.LLM.

The fake stands at the hardware boundary: a CUDA box's LLM with sleep mode.
It tracks which allocations are asleep the way vLLM 0.32 does (`sleep(level=1)`
puts weights and KV cache to sleep; `wake_up(tags)` returns whether the engine
is fully awake) and refuses to generate while any part sleeps.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from types import SimpleNamespace

import pytest

from appliance.engines.engine import Sampling
from appliance.engines.vllm_args import VllmSettings
from appliance.engines.vllm_engine import VLLMEngine

GIB = 1 << 30


@dataclass
class FakeLoRARequest:
    lora_name: str
    lora_int_id: int
    lora_path: str
    load_inplace: bool = False


class RecordingLLMEngine:
    def __init__(self, llm: "RecordingLLM"):
        self.llm = llm
        self.loras: dict[int, FakeLoRARequest] = {}

    def add_lora(self, request: FakeLoRARequest) -> bool:
        assert "weights" not in self.llm.asleep, "adapter loaded into sleeping weights"
        self.llm.calls.append(f"add_lora({request.lora_int_id})")
        self.loras[request.lora_int_id] = request
        return True

    def remove_lora(self, lora_id: int) -> bool:
        self.llm.calls.append(f"remove_lora({lora_id})")
        return self.loras.pop(lora_id, None) is not None

    def list_loras(self) -> list[int]:
        return list(self.loras)


class RecordingLLM:
    """Records sleep / wake_up / adapter / generate calls in order."""

    def __init__(self, **llm_args):
        self.llm_args = llm_args
        self.calls: list[str] = []
        self.asleep: set[str] = set()
        self.llm_engine = RecordingLLMEngine(self)

    def sleep(self, level: int = 1) -> None:
        self.calls.append(f"sleep(level={level})")
        self.asleep = {"weights", "kv_cache"}

    def wake_up(self, tags: list[str] | None = None) -> bool:
        self.calls.append(f"wake_up({tags})")
        self.asleep -= set(tags) if tags else set(self.asleep)
        return not self.asleep

    def generate(self, prompts, sampling_params, use_tqdm=True, lora_request=None):
        assert not self.asleep, f"generate while {sorted(self.asleep)} asleep"
        self.calls.append(f"generate(lora={lora_request.lora_int_id if lora_request else None})")
        outputs = []
        for params in sampling_params:
            samples = [
                SimpleNamespace(
                    token_ids=[5, 6, 2],
                    text="ok",
                    # vLLM returns one {token_id: Logprob} dict per position.
                    logprobs=[
                        {5: SimpleNamespace(logprob=-0.5)},
                        {6: SimpleNamespace(logprob=-1.0)},
                        {2: SimpleNamespace(logprob=-0.25)},
                    ],
                    finish_reason="stop",
                )
                for _ in range(params.n)
            ]
            outputs.append(SimpleNamespace(prompt_token_ids=[1, 2, 3, 4], outputs=samples, lora_request=lora_request))
        return outputs


def fake_vllm_api():
    return SimpleNamespace(
        LLM=RecordingLLM,
        SamplingParams=lambda **kw: SimpleNamespace(**kw),
        LoRARequest=FakeLoRARequest,
        TokensPrompt=dict,
    )


@pytest.fixture
def model_dir(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    return folder


def adapter(tmp_path, name: str, rank: int = 8):
    folder = tmp_path / name
    folder.mkdir()
    (folder / "adapter_config.json").write_text(json.dumps({"r": rank}))
    return folder


def cuda_engine(model_dir, **overrides):
    args = dict(model_name="student", kv_cache_bytes=3 * GIB, device="cuda", max_lora_rank=8)
    args.update(overrides)
    return VLLMEngine(VllmSettings(model_dir, **args), vllm_api=fake_vllm_api())


SAMPLING = Sampling(max_new_tokens=4, n=2, temperature=1.0)


def test_train_step_sleeps_then_wakes_weights_updates_adapter_then_wakes_kv_cache(model_dir, tmp_path):
    engine = cuda_engine(model_dir)
    llm = engine.llm

    engine.generate(["p"], SAMPLING)
    engine.sleep()  # the trainer's phase
    engine.update_adapter(adapter(tmp_path, "step-1"), 1)
    engine.wake()
    engine.generate(["p"], SAMPLING)

    assert llm.calls == [
        "generate(lora=None)",
        "sleep(level=1)",
        "wake_up(['weights'])",
        "add_lora(1)",
        "wake_up(['kv_cache'])",
        "generate(lora=1)",
    ]
    assert engine.last_served_adapter_version == 1


def test_second_update_removes_the_older_adapter_and_generate_wakes_by_itself(model_dir, tmp_path):
    engine = cuda_engine(model_dir)
    llm = engine.llm
    engine.update_adapter(adapter(tmp_path, "step-1"), 1)
    llm.calls.clear()

    engine.sleep()
    engine.update_adapter(adapter(tmp_path, "step-2"), 2)
    engine.generate(["p"], SAMPLING)  # no explicit wake(): generate wakes the KV cache itself

    assert llm.calls == [
        "sleep(level=1)",
        "wake_up(['weights'])",
        "add_lora(2)",
        "remove_lora(1)",
        "wake_up(['kv_cache'])",
        "generate(lora=2)",
    ]
    assert llm.llm_engine.list_loras() == [2]
    assert engine.adapter_version == 2


def test_cuda_engine_gets_exact_kv_bytes_sleep_mode_and_sampling_logprobs(model_dir):
    engine = cuda_engine(model_dir, kv_cache_bytes=3 * GIB + 123, tensor_parallel_size=2)

    args = engine.llm.llm_args
    assert args["kv_cache_memory_bytes"] == 3 * GIB + 123
    assert args["enable_sleep_mode"] is True
    assert args["dtype"] == "bfloat16"
    assert args["tensor_parallel_size"] == 2
    assert args["logprobs_mode"] == "processed_logprobs"
    assert args["served_model_name"] == "student"
    assert args["max_lora_rank"] == 8


def test_cpu_sleep_and_wake_are_recorded_no_ops_and_kv_cache_is_rounded_up_to_gib(model_dir, monkeypatch):
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "0")
    settings = VllmSettings(model_dir, model_name="student", kv_cache_bytes=GIB + GIB // 2, device="cpu")
    engine = VLLMEngine(settings, vllm_api=fake_vllm_api())

    engine.sleep()
    engine.wake()
    engine.generate(["p"], SAMPLING)

    assert engine.llm.calls == ["generate(lora=None)"]
    assert engine.events == ["sleep: no-op (no sleep mode on cpu)", "wake: no-op (no sleep mode on cpu)"]
    assert engine.llm.llm_args["dtype"] == "float32"
    assert "enable_sleep_mode" not in engine.llm.llm_args
    import os

    assert os.environ["VLLM_CPU_KVCACHE_SPACE"] == "2"


def test_generate_returns_sampled_token_logprobs_and_counts_tokens(model_dir):
    engine = cuda_engine(model_dir)

    results = engine.generate(["a", "b"], SAMPLING)

    assert [len(group) for group in results] == [2, 2]
    first = results[1][0]
    assert (first.prompt_index, first.token_ids, first.logprobs, first.finish_reason) == (
        1,
        [5, 6, 2],
        [-0.5, -1.0, -0.25],
        "stop",
    )
    assert engine.counters.generated_tokens == 12
    assert engine.counters.prompt_tokens == 8
    assert engine.counters.calls == 1


def test_adapter_with_rank_above_max_lora_rank_is_refused_and_old_adapter_stays(model_dir, tmp_path):
    engine = cuda_engine(model_dir)
    engine.update_adapter(adapter(tmp_path, "good"), 1)

    with pytest.raises(ValueError, match=r"adapter_config.json: r=16 exceeds the engine's max_lora_rank=8"):
        engine.update_adapter(adapter(tmp_path, "too-big", rank=16), 2)
    with pytest.raises(FileNotFoundError, match="no adapter_config.json"):
        engine.update_adapter(tmp_path, 3)

    assert engine.llm.llm_engine.list_loras() == [1]
    assert engine.adapter_version == 1


def test_judge_engine_without_lora_refuses_adapters(model_dir, tmp_path):
    judge = cuda_engine(model_dir, model_name="judge", enable_lora=False)

    assert judge.llm.llm_args["enable_lora"] is False
    assert "max_lora_rank" not in judge.llm.llm_args
    with pytest.raises(RuntimeError, match="started without LoRA"):
        judge.update_adapter(adapter(tmp_path, "a"), 1)


def job_spec(**overrides):
    from appliance.config.schema import JobSpec

    document = {
        "name": "demo",
        "student": {"model": "smollm2-135m-instruct", "quantization": "nf4", "lora": {"rank": 4}},
        "judge": {"model": "smollm2-135m-instruct", "mode": "group", "max_new_tokens": 64},
        "rewards": [{"name": "correctness"}],
        "grpo": {"group_size": 4, "max_prompt_tokens": 256, "max_new_tokens": 32},
    }
    document.update(overrides)
    return JobSpec.model_validate(document)


def test_engines_for_a_job_take_rank_lengths_and_kv_from_the_job_and_plan(model_dir):
    spec = job_spec()

    student = VLLMEngine.for_student(spec, model_dir, kv_cache_bytes=5 * GIB, device="cuda", vllm_api=fake_vllm_api())
    judge = VLLMEngine.for_judge(spec, model_dir, kv_cache_bytes=2 * GIB, device="cuda", vllm_api=fake_vllm_api())

    s, j = student.llm.llm_args, judge.llm.llm_args
    assert (s["max_lora_rank"], s["max_model_len"], s["kv_cache_memory_bytes"]) == (
        8,
        256 + 32,
        5 * GIB,
    )  # rank 4 -> vLLM's 8
    assert (s["served_model_name"], j["served_model_name"]) == ("smollm2-135m-instruct", "smollm2-135m-instruct-judge")
    # Group mode: the judge's prompt carries the whole group, then it writes its verdict.
    assert (j["max_model_len"], j["kv_cache_memory_bytes"], j["enable_lora"]) == (256 + 4 * 32 + 64, 2 * GIB, False)


def test_cuda_engine_without_a_planned_kv_cache_is_refused(model_dir):
    with pytest.raises(ValueError, match="KV cache size from the budget plan .rollout_kv_bytes."):
        VLLMEngine.for_student(job_spec(), model_dir, device="cuda", vllm_api=fake_vllm_api())
