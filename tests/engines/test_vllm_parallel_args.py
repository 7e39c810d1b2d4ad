"""The judge's vLLM parallelism from resources:, checked as the arguments vllm.LLM receives (GPU-only path)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from appliance.config.job_file import parse_job_text
from appliance.engines.parallel import VllmParallelism, judge_parallelism
from appliance.engines.vllm_engine import VLLMEngine


class RecordingLLM:
    """vllm.LLM at the hardware boundary: records its arguments."""

    built: list[dict] = []

    def __init__(self, **llm_args):
        RecordingLLM.built.append(llm_args)


API = SimpleNamespace(LLM=RecordingLLM, SamplingParams=dict, LoRARequest=dict, TokensPrompt=dict)


def job(resources: str):
    return parse_job_text(
        "name: j\nstudent: {model: s}\njudge: {model: big-judge}\nrewards: [{name: judge}]\n"
        "grpo: {prompts_per_step: 8}\n" + resources
    )


@pytest.fixture
def judge_dir(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    return tmp_path


def _judge_args(spec, judge_dir) -> dict:
    RecordingLLM.built.clear()
    VLLMEngine.for_judge(
        spec,
        judge_dir,
        kv_cache_bytes=1 << 30,
        device="cuda",
        max_model_len=1024,
        vllm_api=API,
        parallelism=judge_parallelism(spec.resources),
    )
    [args] = RecordingLLM.built
    return args


def test_a_colocated_judge_runs_on_one_device(judge_dir):
    args = _judge_args(job("resources: {gpus: 2}\n"), judge_dir)
    assert args["tensor_parallel_size"] == 1
    assert "pipeline_parallel_size" not in args and "distributed_executor_backend" not in args


def test_judge_gpus_give_tensor_parallelism_on_one_box(judge_dir):
    args = _judge_args(job("resources: {gpus: 8, judge_gpus: 4}\n"), judge_dir)
    assert args["tensor_parallel_size"] == 4
    assert "distributed_executor_backend" not in args  # vLLM's own multiprocessing on one box


def test_a_judge_over_several_boxes_uses_pipeline_stages_and_the_ray_executor(judge_dir):
    args = _judge_args(job("resources: {gpus: 8, nodes: 2, judge_gpus: 4}\n"), judge_dir)
    assert (args["tensor_parallel_size"], args["pipeline_parallel_size"]) == (4, 2)
    assert args["distributed_executor_backend"] == "ray"


def test_one_device_adds_nothing_to_vllms_defaults():
    assert VllmParallelism().llm_args() == {}
    assert judge_parallelism(job("resources: {gpus: 2, judge_gpus: 1}\n").resources).llm_args() == {}
