"""The resources: section: defaults, placement rules, and errors at the key's line with did-you-mean."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from appliance.job_checks import check_job_file

BASE = """name: r
student: {model: smollm2-135m-instruct}
rewards:
  - {name: correctness}
grpo:
  prompts_per_step: 4
"""


def _check(tmp_path: Path, extra: str):
    path = tmp_path / "job.yaml"
    path.write_text(BASE + extra)
    return check_job_file(path, tmp_path, check_models=False)


def test_one_gpu_on_one_box_by_default(tmp_path):
    spec, errors = _check(tmp_path, "")
    assert errors == []
    assert (spec.resources.gpus, spec.resources.nodes, spec.resources.world_size) == (1, 1, 1)


def test_student_takes_the_devices_the_judge_leaves(tmp_path):
    spec, errors = _check(tmp_path, "judge: {model: smollm2-135m-instruct}\nresources: {gpus: 5, judge_gpus: 4}\n")
    assert errors == []
    assert spec.resources.student_devices == 1 and spec.resources.world_size == 1


def test_ranks_multiply_over_nodes(tmp_path):
    spec, errors = _check(tmp_path, "resources: {gpus: 2, nodes: 2}\n")
    assert errors == [] and spec.resources.world_size == 4


def test_a_misspelt_key_gets_did_you_mean_at_its_line(tmp_path):
    _, errors = _check(tmp_path, "resources:\n  gpus: 2\n  judge_gpu: 1\n")
    assert len(errors) == 1
    assert errors[0].key == "resources.judge_gpu" and errors[0].line == 9
    assert "judge_gpus" in errors[0].message


def test_a_placement_larger_than_the_box_is_refused(tmp_path):
    _, errors = _check(tmp_path, "judge: {model: m}\nresources:\n  gpus: 4\n  student_gpus: 3\n  judge_gpus: 2\n")
    assert len(errors) == 1 and errors[0].key.startswith("resources")
    assert "raise gpus to 5" in errors[0].message


def test_a_judge_taking_every_device_leaves_the_student_none(tmp_path):
    _, errors = _check(tmp_path, "judge: {model: m}\nresources: {gpus: 2, judge_gpus: 2}\n")
    assert len(errors) == 1 and "no device" in errors[0].message


def test_zero_gpus_is_refused(tmp_path):
    _, errors = _check(tmp_path, "resources: {gpus: 0}\n")
    assert [e.key for e in errors] == ["resources.gpus"]


def test_judge_gpus_without_a_local_judge_is_refused_at_its_line(tmp_path):
    _, errors = _check(tmp_path, "resources:\n  gpus: 2\n  judge_gpus: 1\n")
    assert [(e.key, e.line) for e in errors] == [("resources.judge_gpus", 9)]
    assert "no judge section" in errors[0].message


def test_prompts_must_split_evenly_over_the_ranks(tmp_path):
    _, errors = _check(tmp_path, "resources: {gpus: 3}\n")
    assert [(e.key, e.line) for e in errors] == [("grpo.prompts_per_step", 6)]
    assert "multiple of 3" in errors[0].message


def test_an_agent_job_is_refused_several_ranks(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(
        "name: a\nstudent: {model: m}\ntask: {environment: 'builtin:calculator'}\n"
        "rewards: [{name: environment}]\nresources: {gpus: 2}\n"
    )
    _, errors = check_job_file(path, tmp_path, check_models=False)
    assert [e.key for e in errors] == ["resources.gpus"] and "one rank" in errors[0].message


REFUSED = {
    # what the job asks -> the key its one sentence names, and a word of what to do instead
    "judge: {model: smollm2-135m-instruct}\nresources: {gpus: 4, judge_gpus: 2}\n": (
        "resources.judge_gpus",
        "endpoint",
    ),
    "resources: {gpus: 1, sharding: fsdp}\n": ("resources.sharding", "gpus to 2"),
    "engine: {rollout_weights: merged_copy}\nresources: {gpus: 2, sharding: fsdp}\n": (
        "engine.rollout_weights",
        "rollout_weights: shared",
    ),
    "engine: {rollout: vllm, vllm: {tensor_parallel_size: 2}}\n": ("engine.vllm.tensor_parallel_size", "divide"),
    "engine: {rollout: vllm, vllm: {tensor_parallel_size: 4}}\nresources: {gpus: 2}\n": (
        "engine.vllm.tensor_parallel_size",
        "divide",
    ),
    "engine: {rollout: hf, vllm: {tensor_parallel_size: 2}}\nresources: {gpus: 2}\n": (
        "engine.vllm.tensor_parallel_size",
        "engine.rollout: vllm",
    ),
    "judge: {model: smollm2-135m-instruct}\nengine: {judge: vllm}\nresources: {gpus: 2}\n": (
        "engine.judge",
        "judge.endpoint",
    ),
}


def test_every_layout_the_runtime_does_not_deliver_is_refused_in_one_sentence(tmp_path):
    for extra, (key, advice) in REFUSED.items():
        _, errors = _check(tmp_path, extra)
        assert [error.key for error in errors] == [key], (extra, errors)
        assert advice in errors[0].message and errors[0].message.count(". ") == 0, errors[0].message


def test_appliance_plan_refuses_them_too(tmp_path, capsys):
    from appliance.cli.main import main

    path = tmp_path / "job.yaml"
    path.write_text(BASE + "judge: {model: smollm2-135m-instruct}\nresources: {gpus: 4, judge_gpus: 2}\n")
    assert main(["plan", str(path), "--data-dir", str(tmp_path)]) == 2
    assert "resources.judge_gpus: a judge on devices of its own serves a one-rank job" in capsys.readouterr().err


def test_delivered_layouts_pass(tmp_path):
    for extra in (
        "resources: {gpus: 2, sharding: fsdp}\n",
        "engine: {rollout: vllm, vllm: {tensor_parallel_size: 2}}\nresources: {gpus: 2}\n",
        "judge: {model: smollm2-135m-instruct}\nresources: {gpus: 2}\n",  # a transformers judge on each rank
    ):
        assert _check(tmp_path, extra)[1] == [], extra


# ----- what `auto` resolves to is held to the same rules (appliance plan, the daemon's admission, the trainer) -----

SMOLLM = {"model_type": "llama", "vocab_size": 49152, "hidden_size": 576, "intermediate_size": 1536,
          "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3, "tie_word_embeddings": True,
          "max_position_embeddings": 8192}  # fmt: skip


def _spec(tmp_path: Path, extra: str):
    spec, errors = _check(tmp_path, extra)
    assert errors == [], errors
    return spec


def _plan(spec, kind: str, gib: float):
    from appliance.budget.device_plans import plan_rank
    from appliance.budget.device_probe import DeviceInfo

    return plan_rank(spec, SMOLLM, None, DeviceInfo(kind, int(gib * 2**30), bf16_matmul=kind == "cuda"))


def test_tensor_parallel_with_rollout_auto_is_refused_where_auto_is_transformers(tmp_path):
    """rollout: auto is vLLM on CUDA and transformers on the CPU: there tensor_parallel_size would be ignored."""
    from appliance.job_checks import layout_refusals

    spec = _spec(tmp_path, "engine: {vllm: {tensor_parallel_size: 2}}\nresources: {gpus: 2}\n")
    assert layout_refusals(spec, _plan(spec, "cuda", 80)) == []
    [(key, why)] = layout_refusals(spec, _plan(spec, "cpu", 64))
    assert key == ("engine", "vllm", "tensor_parallel_size") and "auto is transformers on this device" in why


def test_appliance_plan_refuses_what_auto_resolves_to_on_its_device(tmp_path, capsys):
    from appliance.cli.main import main

    path = tmp_path / "job.yaml"
    path.write_text(BASE + "engine: {vllm: {tensor_parallel_size: 2}}\nresources: {gpus: 2}\n")
    config = tmp_path / "config.json"
    config.write_text(__import__("json").dumps(SMOLLM))
    common = ["plan", str(path), "--data-dir", str(tmp_path), "--model-config", f"smollm2-135m-instruct={config}"]
    assert main([*common, "--device", "cpu", "--device-memory", "64GiB"]) == 2
    assert "engine.vllm.tensor_parallel_size: tensor_parallel_size splits vLLM's copy" in capsys.readouterr().err
    assert main([*common, "--device", "cuda", "--device-memory", "80GiB"]) == 0


def test_sharding_the_plan_chose_refuses_a_merged_copy_the_job_set(tmp_path):
    """sharding: auto shards a base whose whole copy does not fit: a merged copy set in the job is then the whole
    dequantized copy on every rank that config check refuses under sharding: fsdp."""
    from appliance.job_checks import layout_refusals

    spec = _spec(tmp_path, "engine: {rollout: hf, rollout_weights: merged_copy}\nresources: {gpus: 4}\n")
    small = _plan(spec, "cuda", 0.5)
    assert small.choices.sharding == "fsdp"
    [(key, why)] = layout_refusals(spec, small)
    assert key == ("engine", "rollout_weights") and "as the plan chose" in why
    assert _plan(spec, "cuda", 80).choices.sharding == "ddp" and layout_refusals(spec, _plan(spec, "cuda", 80)) == []


@settings(max_examples=40, deadline=None)
@given(
    quantization=st.sampled_from(["none", "nf4"]),
    ranks=st.sampled_from([2, 4, 8]),
    sharding=st.sampled_from(["auto", "fsdp"]),
    rollout=st.sampled_from(["auto", "hf", "vllm"]),
    kind=st.sampled_from(["cpu", "cuda"]),
    gib=st.sampled_from([0.3, 0.6, 1.0, 4.0, 80.0]),
)
def test_auto_never_resolves_to_a_layout_config_check_refuses(quantization, ranks, sharding, rollout, kind, gib):
    """A job config check accepts, with rollout_weights left to auto, is never planned into a refused layout
    (the merged copy under a sharded base was: it crashed on the first step, mixing a DTensor into the merge)."""
    from appliance.config.schema import JobSpec
    from appliance.job_checks import layout_refusals

    spec = JobSpec.model_validate({
        "name": "r", "student": {"model": "m", "quantization": quantization},
        "task": {"dataset": "builtin:multiply"}, "rewards": [{"name": "correctness"}],
        "grpo": {"prompts_per_step": 8}, "engine": {"rollout": rollout},
        "resources": {"gpus": ranks, "sharding": sharding},
    })  # fmt: skip
    assert layout_refusals(spec) == []
    plan = _plan(spec, kind, gib)
    assert not (plan.choices.sharding == "fsdp" and plan.choices.rollout_weights == "merged_copy"), plan.choices
    assert layout_refusals(spec, plan) == []


JUDGES = {
    "none": None,
    "remote": {"model": "m", "endpoint": "http://127.0.0.1:9/v1"},
    "student's base": {"model": "m", "share_student_base": True},
    "local": {"model": "m"},
}


@settings(max_examples=40, deadline=None)
@given(
    judge=st.sampled_from(sorted(JUDGES)),
    engine=st.sampled_from(["auto", "hf", "vllm"]),
    judge_gpus=st.sampled_from([1, 2, 4]),
    kind=st.sampled_from(["cpu", "cuda"]),
)
def test_judge_gpus_are_accepted_only_for_a_local_vllm_judge(tmp_path_factory, judge, engine, judge_gpus, kind):
    """judge_gpus gives the judge GPUs of its own, which only a local vLLM judge runs on (make_judge): a
    transformers judge (set, or auto on the CPU) loaded on the student's device, a remote judge or the student's base
    had none to use, on the CPU the judge shared the student's memory, and `appliance plan` crashed planning the
    devices of a judge it had no config for."""
    from appliance.cli.main import main
    from appliance.job_checks import layout_refusals

    tmp_path = tmp_path_factory.mktemp("judge")
    section = f"judge: {__import__('json').dumps(JUDGES[judge])}\n" if JUDGES[judge] else ""
    rewards = "rewards: [{name: judge}]\n" if JUDGES[judge] else "rewards: [{name: correctness}]\n"
    path = tmp_path / "job.yaml"
    path.write_text(
        "name: r\nstudent: {model: m}\ntask: {dataset: 'builtin:multiply'}\n" + section + rewards
        + f"engine: {{judge: {engine}}}\nresources: {{gpus: {judge_gpus + 1}, judge_gpus: {judge_gpus}}}\n"
    )  # fmt: skip
    config = tmp_path / "config.json"
    config.write_text(__import__("json").dumps(SMOLLM))
    command = ["plan", str(path), "--data-dir", str(tmp_path), "--model-config", f"m={config}", "--device", kind]
    runs = judge == "local" and engine != "hf" and kind == "cuda"  # the CPU has no devices to give a judge
    assert main([*command, "--device-memory", "80GiB"]) == (0 if runs else 2)
    spec, errors = check_job_file(path, tmp_path, check_models=False)
    if judge == "local" and engine != "hf":
        assert errors == [] and layout_refusals(spec) == []  # what auto resolves to is the plan's to hold
        return
    [error] = errors
    assert error.key == "resources.judge_gpus" and error.message.count(". ") == 0, error.message
