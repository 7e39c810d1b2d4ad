"""The built-in environments train end to end through run_job (the path `appliance train` takes) with the
bundled model (builtin:calculator in tests/agents/test_calculator_learning.py): reward per step, trajectory records whose segments show trained and context parts, checkpoints,
and a resume that continues the run. Kept small: 2 scenarios x 2 rollouts, 2 turns of 16 tokens, 2 steps."""

from __future__ import annotations

import json

import pytest

from appliance.agents.endpoint_file import read_endpoint_file
from appliance.job_checks import load_checked_job
from appliance.grpo.records import read_jsonl
from appliance.grpo.run import run_job

pytestmark = pytest.mark.model

JOB = """\
name: agent-{short}
student: {{model: smollm2-135m-instruct, quantization: nf4, lora: {{rank: 8, alpha: 16}}}}
task: {{environment: "builtin:{short}", max_turns: 2}}
rewards: [{{name: environment}}]
grpo: {{group_size: 2, prompts_per_step: 2, max_new_tokens: 16, steps: {steps}, micro_batch_size: 4,
        learning_rate: 1.0e-4}}
checkpoint: {{every: 1, keep_last: 2}}
"""


def _spec(tmp_path, data_dir, short, steps):
    path = tmp_path / f"{short}-{steps}.yaml"
    path.write_text(JOB.format(short=short, steps=steps))
    return load_checked_job(path, data_dir)


# builtin:calculator's run (records, mask, worked episodes as context, reward per step, held-out evaluation
# before and after) is tests/agents/test_calculator_learning.py, which trains it for real; resume is the same
# code for every environment.
@pytest.mark.parametrize("short", ["email_search", "game2048"])
def test_an_agent_job_runs_records_trajectories_and_resumes(tmp_path, fresh_data_dir, short):
    job_dir = fresh_data_dir / "jobs" / f"agent-{short}"
    result = run_job(_spec(tmp_path, fresh_data_dir, short, 2), fresh_data_dir, job_dir, job_file_dir=tmp_path)
    assert (result.status, result.step) == ("completed", 2)
    assert (job_dir / "checkpoints" / "step-000002" / "state.json").is_file()

    metrics = read_jsonl(job_dir / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2]
    assert all("environment" in m["rewards"] and m["completions"] == 4 for m in metrics)
    samples = read_jsonl(job_dir / "samples.jsonl")
    assert len(samples) == 8 and all(s["kind"] == "trajectory" for s in samples)
    for sample in samples:
        assert sample["environment"] == f"builtin:{short}"
        assert sample["messages"][0]["role"] == "system"
        trained = [s for s in sample["segments"] if s["trained"]]
        context = [s for s in sample["segments"] if not s["trained"]]
        assert trained and context  # the operator sees both parts
        last = [m for m in sample["messages"] if m["role"] == "assistant"][-1]
        assert last["content"] in "".join(s["text"] for s in trained)
        assert sample["context_tokens"] > sample["trained_tokens"] > 0
    # trained tokens in the step record are the masked (assistant) tokens of the trajectories it trained on
    for step in (1, 2):
        informative = metrics[step - 1]["groups_informative"]
        trained = sorted(s["trained_tokens"] for s in samples if s["step"] == step and s["advantage"] != 0.0)
        assert metrics[step - 1]["trained_tokens"] == (sum(trained) if informative else 0)

    resumed = run_job(
        _spec(tmp_path, fresh_data_dir, short, 3), fresh_data_dir, job_dir, job_file_dir=tmp_path, resume=True
    )
    assert (resumed.status, resumed.step) == ("completed", 3)
    assert [m["step"] for m in read_jsonl(job_dir / "metrics.jsonl")] == [1, 2, 3]
    assert json.loads((job_dir / "checkpoints" / "step-000003" / "state.json").read_text())["step"] == 3


def test_an_external_job_waiting_for_trajectories_stops_when_asked(tmp_path, fresh_data_dir):
    """A pause, cancel or SIGTERM reaches an agent job that waits for submitted groups: no step, no kill timeout."""
    import threading
    import time

    path = tmp_path / "external.yaml"
    path.write_text(JOB.format(short="calculator", steps=2).replace('"builtin:calculator"', "external"))
    spec = load_checked_job(path, fresh_data_dir)
    job_dir = fresh_data_dir / "jobs" / "agent-external"
    job_dir.mkdir(parents=True)  # as appliance train and the daemon do before run_job
    polls: list[float] = []

    def stop_requested():
        polls.append(time.monotonic())
        # The run loop's poll before step 1 lets it start; then the trainer waits in collect, which must poll too.
        return "paused by the operator" if len(polls) > 1 else None

    box: dict = {}

    def run() -> None:
        try:
            box["result"] = run_job(spec, fresh_data_dir, job_dir, job_file_dir=tmp_path, stop_requested=stop_requested)
        except Exception as error:  # surfaced below
            box["result"] = error

    runner = threading.Thread(target=run, daemon=True)
    runner.start()
    runner.join(timeout=300)
    assert not runner.is_alive(), "the job kept waiting for trajectory groups after the stop request"
    result = box["result"]
    assert not isinstance(result, Exception), repr(result)
    assert (result.status, result.step, result.stop_reason) == ("stopped", 0, "paused by the operator")
    assert read_endpoint_file(job_dir) is None and not (job_dir / "metrics.jsonl").exists()  # not serving
