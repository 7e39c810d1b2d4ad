"""Fixed daemon answers for the snapshot tests: real API types and StepRecords, a frozen clock.

Only the snapshot tests use these (the Pilot tests run a real daemon). The
screens under test are subclassed so that their one I/O seam, start_polling,
posts these answers instead of starting a poller; everything else is the
production code.
"""

from __future__ import annotations

import math
from pathlib import Path

from appliance.grpo.step_record import EvalResult, MemoryReading, RewardStats, StepRecord
from appliance.service.api import CheckpointInfo, DeviceStatus, JobDetail, JobSummary, SlotStatus
from tui import messages
from tui.app import ApplianceApp
from tui.screens.compare import CompareScreen
from tui.screens.device import DeviceScreen
from tui.screens.job import JobScreen
from tui.screens.jobs import JobsScreen
from tui.screens.new_job import NewJobScreen

NOW = 1_790_000_000.0  # the frozen clock
GIB = 2**30
NOWHERE = "/nonexistent/appliance-snapshot.sock"  # never connected to: nothing here polls

PLAN = {
    "device": {"kind": "cpu", "name": "cpu", "total_bytes": 24 * GIB, "used_bytes": 3 * GIB},
    "budget_bytes": int(21.6 * GIB),
    "compute_dtype": "float32",
    "engines": {"rollout": "hf", "judge": None},
    "components": {
        "student_weights": int(0.12 * GIB),
        "student_lora": int(0.01 * GIB),
        "optimizer": int(0.03 * GIB),
        "activations": int(2.4 * GIB),
        "rollout_kv": int(0.6 * GIB),
        "runtime": int(1.1 * GIB),
    },
    "phases": {},
    "peak_bytes": int(4.26 * GIB),
    "fits": True,
    "choices": {
        "micro_batch_size": 8,
        "gradient_checkpointing": False,
        "rollout_weights": "merged",
        "time_share": False,
    },
    "overflow": [],
    "suggestions": [],
}


def record(job: str, step: int, total: int, shift: float = 0.0) -> StepRecord:
    """A plausible step: reward rising with noise, eval every 10 steps."""
    reward = 0.35 + 0.5 * (1 - math.exp(-step / 15)) + 0.05 * math.sin(step) + shift
    correctness = max(0.0, reward - 0.4)
    return StepRecord(
        job=job,
        step=step,
        steps_total=total,
        time=NOW - (total - step) * 9.0,
        reward_mean=reward,
        reward_std=0.3,
        rewards={"correctness": RewardStats(correctness, 0.4), "strict_format": RewardStats(0.8, 0.2)},
        loss=0.02 * math.cos(step),
        kl=0.001 * step,
        clip_ratio=0.01,
        grad_norm=0.5,
        learning_rate=2e-4,
        nonfinite=False,
        groups_informative=3,
        groups_total=4,
        trained_sequences=24,
        trained_tokens=300,
        micro_batch_size=8,
        completions=32,
        completion_length_mean=12.0 - step * 0.05,
        completion_length_max=16,
        generated_tokens={"student": 384},
        prompt_tokens={"student": 2400},
        tokens_per_second={"student": 95.0 + step % 5},
        seconds={"generate": 4.1, "reward": 0.01, "train": 4.6, "sync": 0.2, "step": 9.0},
        memory=MemoryReading(
            peak_rss_bytes=int(3.4 * GIB),
            planned_peak_bytes=int(4.26 * GIB),
            components_used_bytes={"student_weights": int(0.12 * GIB)},
        ),
        eval=EvalResult(accuracy=0.28 + 0.012 * step + shift, format_compliance=0.9, reward_mean=reward, problems=100)
        if step % 10 == 0
        else None,
    )


def summary(job_id: str, name: str, state: str, step: int, total: int, age: float, **extra) -> JobSummary:
    return JobSummary(
        id=job_id,
        name=name,
        state=state,
        uid=1000,
        user="ops",
        created=NOW - age,
        updated=NOW - 5,
        step=step,
        steps_total=total,
        **extra,
    )


JOBS = [
    summary("3f9a1c07de", "multiply-demo", "running", 37, 50, 340, slot=0, phase="train"),
    summary("b2c4e6f801", "gsm8k-cpu", "queued", 0, 200, 120),
    summary("0a1b2c3d4e", "multiply-lr-sweep", "succeeded", 50, 50, 5400),
    summary("9e8d7c6b5a", "judge-ruler", "failed", 12, 100, 9000, reason="worker died 3 times"),
    summary("5566778899", "multiply-long", "paused", 20, 400, 86000),
]
HISTORY = {
    "3f9a1c07de": [record("multiply-demo", step, 50) for step in range(1, 38)],
    "0a1b2c3d4e": [record("multiply-lr-sweep", step, 50, shift=-0.08) for step in range(1, 51)],
    "9e8d7c6b5a": [record("judge-ruler", step, 100, shift=-0.2) for step in range(1, 13)],
    "5566778899": [record("multiply-long", step, 400, shift=0.03) for step in range(1, 21)],
}
BUDGETS = {job.id: PLAN["budget_bytes"] for job in JOBS}

DETAIL = JobDetail(
    **JOBS[0].model_dump(),
    spec={
        "name": "multiply-demo",
        "student": {"model": "smollm2-135m-instruct", "quantization": "nf4"},
        "task": {"dataset": "builtin:multiply"},
        "grpo": {"group_size": 8, "prompts_per_step": 4, "steps": 50},
    },
    plan=PLAN,
    checkpoints=[
        CheckpointInfo(step=20, path="checkpoints/step-000020"),
        CheckpointInfo(step=30, path="checkpoints/step-000030"),
    ],
    best={"step": 30, "metric": "eval_accuracy", "value": 0.64},
    job_dir="/var/lib/appliance/jobs/3f9a1c07de",
)
LOG = [
    f"step {step}/50 reward {r.reward_mean:.3f} loss {r.loss:.4f} 9.0s"
    for step, r in enumerate(HISTORY["3f9a1c07de"], start=1)
]

DEVICE = DeviceStatus(
    slots=[
        SlotStatus(
            index=0,
            kind="cpu",
            name="cpu",
            total_bytes=24 * GIB,
            used_bytes=int(6.1 * GIB),
            job_id="3f9a1c07de",
            phase="train",
            budget_bytes=PLAN["budget_bytes"],
            planned_bytes=PLAN["components"],
            measured_bytes={
                "student_weights": int(0.12 * GIB),
                "student_lora": int(0.01 * GIB),
                "optimizer": int(0.02 * GIB),
                "activations": int(1.9 * GIB),
                "rollout_kv": int(0.4 * GIB),
                "runtime": int(0.9 * GIB),
            },
        )
    ],
    disk_free_bytes=412 * GIB,
)


class FixedJobsScreen(JobsScreen):
    def start_polling(self) -> None:
        self.post_message(messages.JobsLoaded(JOBS, {k: v[-16:] for k, v in HISTORY.items()}, BUDGETS))


SAMPLES = [  # samples.jsonl lines of step 37: two prompts, two completions each
    {
        "step": 37,
        "question": "What is 7 * 8?",
        "reference": "56",
        "completion": "7 * 8 = 56 <answer>56</answer>",
        "reward": 1.5,
        "rewards": {"correctness": 1.0, "strict_format": 1.0},
        "advantage": 0.71,
    },
    {
        "step": 37,
        "question": "What is 7 * 8?",
        "reference": "56",
        "completion": "<answer>54</answer>",
        "reward": 0.5,
        "rewards": {"correctness": 0.0, "strict_format": 1.0},
        "advantage": -0.71,
    },
    {
        "step": 37,
        "question": "What is 11 * 3?",
        "reference": "33",
        "completion": "11 * 3 = 33 <answer>33</answer>",
        "reward": 1.5,
        "rewards": {"correctness": 1.0, "strict_format": 1.0},
        "advantage": 0.0,
    },
    {
        "step": 37,
        "question": "What is 11 * 3?",
        "reference": "33",
        "completion": "The answer is 33.",
        "reward": 1.5,
        "rewards": {"correctness": 1.0, "strict_format": 0.0},
        "advantage": 0.0,
    },
]


def trajectory(reward: float, advantage: float, found: str, answer: str) -> dict:
    """A samples.jsonl line of an agent job, in the shape the trainer writes (messages and mask agree)."""
    system = "You search a mailbox with tools and answer with the id of the right email."
    user = "Find the email in which Dana names the venue of the March offsite."
    search = '{"query": "offsite venue"}'
    answered = f'{{"message_id": "{answer}"}}'
    messages = [
        {"role": "system", "content": system},
        {"role": "user", "content": user},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "search", "arguments": search}}],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": found},
        {
            "role": "assistant",
            "content": "It is the second result.",
            "tool_calls": [{"id": "call_2", "type": "function", "function": {"name": "answer", "arguments": answered}}],
        },
    ]
    segments = [
        (f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n", False),
        (f'<tool_call>{{"name": "search", "arguments": {search}}}</tool_call><|im_end|>', True),
        (f"\n<|im_start|>tool\n{found}<|im_end|>\n<|im_start|>assistant\n", False),
        (
            f'It is the second result.<tool_call>{{"name": "answer", "arguments": {answered}}}</tool_call><|im_end|>',
            True,
        ),
    ]
    return {
        "step": 12,
        "kind": "trajectory",
        "environment": "email_search",
        "scenario": "march-offsite-venue (seed 7)",
        "reward": reward,
        "rewards": {"correct": 1.0 if reward > 0.5 else 0.0, "steps": 0.8},
        "advantage": advantage,
        "metrics": {"turns": 2.0, "tool_calls": 2.0},
        "messages": messages,
        "segments": [{"text": text, "trained": trained} for text, trained in segments],
        "trained_tokens": 41,
        "context_tokens": 96,
    }


TRAJECTORIES = [  # samples.jsonl lines of step 12 of an agent job: one scenario, two rollouts
    trajectory(
        0.9,
        0.71,
        '[{"id": "m-0412", "subject": "Offsite logistics"}, {"id": "m-0419", "subject": "Re: venue for March"}]',
        "m-0419",
    ),
    trajectory(0.1, -0.71, '[{"id": "m-0412", "subject": "Offsite logistics"}]', "m-0412"),
]


class FixedJobScreen(JobScreen):
    def start_polling(self) -> None:
        self.post_message(messages.JobLoaded(DETAIL))
        self.post_message(messages.StepsArrived(DETAIL.id, HISTORY[DETAIL.id]))
        self.post_message(messages.LogLoaded(DETAIL.id, LOG, reset=True))

    def load_tab(self, tab: str | None) -> None:
        if tab == "samples":
            self.post_message(messages.SamplesLoaded(DETAIL.id, 37, [35, 36, 37], SAMPLES))


class FixedAgentJobScreen(FixedJobScreen):
    def load_tab(self, tab: str | None) -> None:
        if tab == "samples":
            self.post_message(messages.SamplesLoaded(DETAIL.id, 12, [11, 12], TRAJECTORIES))


class FixedCompareScreen(CompareScreen):
    def start_polling(self) -> None:
        ids = ["3f9a1c07de", "0a1b2c3d4e", "5566778899"]
        self.post_message(messages.HistoriesLoaded({i: HISTORY[i] for i in ids}, {job.id: job.name for job in JOBS}))


class FixedDeviceScreen(DeviceScreen):
    def start_polling(self) -> None:
        self.post_message(messages.DeviceLoaded(DEVICE, {"3f9a1c07de": PLAN}))


EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "multiply.yaml"

SCREENS = {
    "new job": NewJobScreen,
    "jobs": FixedJobsScreen,
    "job": lambda: FixedJobScreen(DETAIL.id, DETAIL.name),
    "agent job": lambda: FixedAgentJobScreen(DETAIL.id, DETAIL.name),
    "compare": lambda: FixedCompareScreen(["3f9a1c07de", "0a1b2c3d4e", "5566778899"]),
    "device": FixedDeviceScreen,
}


class FixedApp(ApplianceApp):
    """The real app with its first screen replaced by a fixed one and no events poller."""

    def __init__(self, screen: str):
        super().__init__(NOWHERE, now=lambda: NOW)
        self.first_screen = SCREENS[screen]

    def start(self) -> None:
        self.push_screen(self.first_screen())
