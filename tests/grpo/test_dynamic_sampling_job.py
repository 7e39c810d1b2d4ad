"""Dynamic sampling, prompt skipping and the default best/ in run_job on the tiny model (real parts, seconds a step).

A plugin reward gives completions of prompts with an even first operand a length-based score (spread) and those
with an odd one a constant (no spread), so which groups are informative is known in advance.
"""

from __future__ import annotations

import json

import pytest
from tiny_model import tiny_job

from appliance.job_checks import load_checked_job
from appliance.grpo.run import run_job
from appliance.grpo.step_record import StepRecord
from appliance.tasks.multiply import load_multiply

pytestmark = pytest.mark.model

PARITY_REWARD = """
def parity(prompt, completion, reference, metadata):
    return len(completion) / 100.0 if metadata["a"] % 2 == 0 else 0.5


def flat(prompt, completion, reference, metadata):
    return 1.0
"""


def _run(tiny_model_dir, tmp_path, data_dir, reward: str, **sections):
    job_file = tiny_job(tiny_model_dir, tmp_path, rewards=[{"name": f"parity.py:{reward}"}], **sections)
    (tmp_path / "parity.py").write_text(PARITY_REWARD)
    spec = load_checked_job(job_file, data_dir)
    job_dir = data_dir / "jobs" / "tiny"
    run_job(spec, data_dir, job_dir, job_file_dir=tmp_path)
    lines = (job_dir / "metrics.jsonl").read_text().splitlines()
    return job_dir, [StepRecord.from_dict(json.loads(line)) for line in lines]


def test_dynamic_sampling_trains_a_full_batch_of_informative_groups(tiny_model_dir, tmp_path, fresh_data_dir):
    _, records = _run(
        tiny_model_dir,
        tmp_path,
        fresh_data_dir,
        "parity",
        grpo={"steps": 3, "prompts_per_step": 2, "dynamic_sampling": True, "max_sampling_rounds": 8},
    )
    for record in records:
        assert record.groups_trained == 2 and record.trained_sequences == 2 * 4  # 2 groups x group_size 4
        assert record.groups_total == 2 * record.sampling_rounds  # every round generated, all counted
        assert record.groups_informative >= 2 and record.completions == record.groups_total * 4
    # About half the prompts have an odd first operand, so some step needed more than one round.
    assert max(record.sampling_rounds for record in records) > 1


def test_dynamic_sampling_stops_at_its_bound_when_no_group_has_spread(tiny_model_dir, tmp_path, fresh_data_dir):
    _, records = _run(
        tiny_model_dir,
        tmp_path,
        fresh_data_dir,
        "flat",
        grpo={"steps": 2, "dynamic_sampling": True, "max_sampling_rounds": 3},
    )
    for record in records:
        assert (record.sampling_rounds, record.groups_total, record.groups_informative) == (3, 6, 0)
        assert record.groups_trained == 0 and record.trained_sequences == 0


def test_settled_prompts_are_skipped_and_their_state_is_checkpointed(tiny_model_dir, tmp_path, fresh_data_dir):
    # 36 pairs, 8 held out: 28 training prompts, 7 a step, so the second pass over the data starts at step 5.
    job_dir, records = _run(
        tiny_model_dir,
        tmp_path,
        fresh_data_dir,
        "parity",
        task={"operand_min": 2, "operand_max": 7, "held_out": 8},
        grpo={"steps": 6, "prompts_per_step": 7, "group_size": 2, "max_new_tokens": 4, "skip_settled_after": 1},
        checkpoint={"every": 6},
    )
    assert all(record.prompts_skipped == 0 for record in records[:4])  # nothing is settled in the first pass
    assert sum(record.prompts_skipped for record in records[4:]) > 0
    state = json.loads((job_dir / "checkpoints" / "step-000006" / "state.json").read_text())
    odd = {f"multiply-{a}x{b}" for a in (3, 5, 7) for b in range(2, 8)}
    held_out = {problem.id for problem in load_multiply(2, 7, 8, 0)[1]}
    assert odd - held_out <= set(state["skipped_prompts"])  # an odd first operand (constant reward) is settled


def test_best_follows_held_out_accuracy_by_default(tiny_model_dir, tmp_path, fresh_data_dir):
    """eval_every: auto on a task with held-out problems: evaluated at the last step, best/ by eval.accuracy."""
    job_dir, records = _run(
        tiny_model_dir,
        tmp_path,
        fresh_data_dir,
        "parity",
        grpo={"steps": 2},
        checkpoint={"every": 2, "keep_last": 2, "eval_every": "auto"},
    )
    first, last = records
    assert first.eval is None and last.eval is not None
    assert last.eval.problems == 8 and last.seconds["eval"] > 0  # the cost is in the record
    best = json.loads((job_dir / "best" / "best.json").read_text())
    assert (best["metric"], best["step"], best["value"]) == ("eval.accuracy", 2, last.eval.accuracy)
