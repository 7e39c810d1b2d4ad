"""plan_devices: one plan per device of resources:, FSDP shards, judge TP shards, refusals naming the device."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from appliance.budget.components import weights_bytes
from appliance.budget.device_probe import DeviceInfo
from appliance.budget.device_plans import plan_devices, rank_job, refusal
from appliance.budget.plan import budget_of, plan_job
from appliance.budget.shapes import fixture_for, load_config, shape_from_config
from appliance.cli.main import main
from appliance.config.job_file import parse_job_text

GIB = 2**30
SMOLLM = {"model_type": "llama", "vocab_size": 49152, "hidden_size": 576, "intermediate_size": 1536,
          "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3, "tie_word_embeddings": True,
          "max_position_embeddings": 8192}  # fmt: skip
GPU80 = DeviceInfo("cuda", 80 * GIB, 0, "fake")
COMMON = """
task: {dataset: builtin:gsm8k}
rewards: [{name: correctness}]
grpo: {group_size: 16, prompts_per_step: 16, max_new_tokens: 512, max_prompt_tokens: 256}
engine: {rollout: vllm, judge: vllm}
"""
STUDENT_8B = "student: {model: Llama-3.1-8B, quantization: nf4, gradient_checkpointing: true}\n"
JUDGE_70B = "judge: {model: Llama-3.1-70B, quantization: none, mode: group}\n"


def config(name: str) -> dict:
    return load_config(fixture_for(name))


def job(text: str):
    return parse_job_text("name: j\n" + text + COMMON)


def test_one_device_by_default_is_the_plan_of_the_whole_job():
    spec = job(STUDENT_8B)
    [device] = plan_devices(spec, config("Llama-3.1-8B"), None, GPU80)
    whole = plan_job(spec, config("Llama-3.1-8B"), None, GPU80)
    assert (device.role, device.rank, device.sharding) == ("student", 0, "ddp")
    assert device.peak_bytes == whole.peak_bytes and device.components == whole.components


def test_student_ranks_and_judge_shards_each_get_a_plan():
    spec = job(STUDENT_8B + JUDGE_70B + "resources: {gpus: 8, judge_gpus: 4}\n")
    devices = plan_devices(spec, config("Llama-3.1-8B"), config("Llama-3.1-70B"), GPU80)
    assert [d.role for d in devices] == ["student"] * 4 + ["judge"] * 4
    assert [d.index for d in devices] == list(range(8)) and [d.rank for d in devices[:4]] == [0, 1, 2, 3]
    assert rank_job(spec).grpo.prompts_per_step == 4 and rank_job(spec).judge is None
    assert devices[0].plan.components["judge_weights"] == 0  # the judge is not on the student's devices
    whole_judge = weights_bytes(shape_from_config(config("Llama-3.1-70B")), "none", 2)
    assert devices[4].components["judge_weights"] == -(-whole_judge // 4)
    assert all(d.fits for d in devices) and refusal(devices) == ""


def test_fsdp_shards_the_base_that_ddp_cannot_hold_and_vllm_holds_its_share_of_a_copy():
    """The plan counts what the runtime holds: each rank's shard of the base, and vLLM's copy over the ranks that
    share it (engine.vllm.tensor_parallel_size); a whole vLLM copy on every rank does not fit beside it."""
    student = "student: {model: Llama-3.1-70B, quantization: nf4, gradient_checkpointing: true}\n"
    gpu40 = DeviceInfo("cuda", 40 * GIB, 0, "fake")  # the 4-bit 70B base (~37 GiB) leaves no room whole
    ddp = plan_devices(job(student + "resources: {gpus: 8, sharding: ddp}\n"), config("Llama-3.1-70B"), None, gpu40)
    whole_copies = plan_devices(job(student + "resources: {gpus: 8}\n"), config("Llama-3.1-70B"), None, gpu40)
    spec = job(student + "resources: {gpus: 8}\n")
    vllm = spec.engine.vllm.model_copy(update={"tensor_parallel_size": 8})
    shared_copy = spec.model_copy(update={"engine": spec.engine.model_copy(update={"vllm": vllm})})
    auto = plan_devices(shared_copy, config("Llama-3.1-70B"), None, gpu40)
    whole = ddp[0].components["student_weights"]
    assert auto[0].sharding == "fsdp" and ddp[0].sharding == "ddp" and not ddp[0].fits
    shape = shape_from_config(config("Llama-3.1-70B"))
    packed = (shape.linear_params + 1) // 2  # the layers' 4-bit weights: sharded; the rest whole on each rank
    assert auto[0].components["student_weights"] == whole - packed + -(-packed // 8) + -(-packed // shape.layers)
    assert whole / 8 < auto[0].components["student_weights"] < whole / 2
    copy = whole_copies[0].components["rollout_weights"]
    assert auto[0].components["rollout_weights"] == -(-copy // 8)
    assert not whole_copies[0].fits and "rollout_weights" in refusal(whole_copies)
    assert len(auto) == 8 and auto[0].fits


def test_a_judge_too_large_for_its_devices_names_the_device_and_component():
    spec = job(STUDENT_8B + JUDGE_70B + "resources: {gpus: 2, judge_gpus: 1}\n")
    devices = plan_devices(spec, config("Llama-3.1-8B"), config("Llama-3.1-70B"), GPU80)
    assert devices[0].fits and not devices[1].fits
    assert refusal(devices).startswith("device 1 (judge, 1/1 of it under tensor parallelism)")
    assert "judge_weights" in refusal(devices) and "resources.judge_gpus" in refusal(devices)


def test_a_student_rank_that_does_not_fit_is_named_with_its_rank(tmp_path):
    spec = job(STUDENT_8B + "resources: {gpus: 2, nodes: 2, sharding: ddp}\n")
    devices = plan_devices(spec, config("Llama-3.1-8B"), None, DeviceInfo("cuda", 4 * GIB, 0, "small"))
    assert [(d.node, d.index, d.rank) for d in devices] == [(0, 0, 0), (0, 1, 1), (1, 0, 2), (1, 1, 3)]
    assert refusal(devices).startswith("device 0 (student rank 0): the ")


def test_plan_json_lists_every_device_and_exits_3_when_one_does_not_fit(tmp_path, capsys):
    path = tmp_path / "job.yaml"
    path.write_text("name: j\n" + STUDENT_8B + JUDGE_70B + "resources: {gpus: 2, judge_gpus: 1}\n" + COMMON)
    code = main(["plan", str(path), "--device-memory", "80GiB", "--json", "--data-dir", str(tmp_path)])
    document = json.loads(capsys.readouterr().out)
    assert code == 3 and document["fits"] is False
    assert [(d["role"], d["fits"]) for d in document["devices"]] == [("student", True), ("judge", False)]
    assert document["devices"][1]["tensor_parallel"] == 1
    main(["plan", str(path), "--device-memory", "80GiB", "--data-dir", str(tmp_path)])
    assert "device 1 (judge" in capsys.readouterr().err


def test_a_judge_on_devices_of_its_own_beside_several_ranks_is_refused_not_planned():
    from appliance.job_checks import layout_refusals

    spec = job(STUDENT_8B + JUDGE_70B + "resources: {gpus: 4, nodes: 2, judge_gpus: 2}\n")
    refusals = dict(layout_refusals(spec))
    assert "judge.endpoint" in refusals[("resources", "judge_gpus")]


@settings(max_examples=30, deadline=None)
@given(ranks=st.sampled_from([2, 3, 4]), gib=st.sampled_from([2, 3, 5, 8, 16, 64]), nodes=st.sampled_from([1, 2]))
def test_the_ranks_of_a_cpu_box_fit_together_in_its_memory(ranks, gib, nodes):
    """On the CPU a box's ranks share one memory: the plan accepts a layout only when every rank of the box fits
    in it at once (each was planned against the whole box, and two ranks of 2.6 GiB fitted a 3 GiB box)."""
    spec = parse_job_text(
        "name: j\nstudent: {model: m, quantization: none}\ntask: {dataset: builtin:multiply}\n"
        f"rewards: [{{name: correctness}}]\ngrpo: {{prompts_per_step: {ranks * nodes * 2}, group_size: 8}}\n"
        f"resources: {{gpus: {ranks}, nodes: {nodes}}}\n"
    )
    box = DeviceInfo("cpu", gib * GIB, 0, "fake")
    devices = plan_devices(spec, SMOLLM, None, box)
    on_box = [device for device in devices if device.node == 0]
    assert len(on_box) == ranks
    if not refusal(devices):
        assert sum(device.peak_bytes for device in on_box) <= budget_of(spec, box)
    gpu = DeviceInfo("cuda", gib * GIB, 0, "fake", bf16_matmul=True)  # a GPU is each rank's own
    assert plan_devices(spec, SMOLLM, None, gpu)[0].budget_bytes == budget_of(spec, gpu)
