"""The resources: section: defaults, placement rules, and errors at the key's line with did-you-mean."""

from __future__ import annotations

from pathlib import Path

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
