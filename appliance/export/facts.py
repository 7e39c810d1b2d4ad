"""What a job's records say about a run, for the model card: steps, rewards, held-out accuracy.

Held-out accuracy comes from the evaluations the run recorded: step records
carrying an `eval` result (periodic held-out evaluation), and `eval.json`
(`appliance train --eval`: the base model before, the final adapter after).
Nothing is measured here; what the run did not record is reported as such.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from appliance.grpo.records import read_jsonl


@dataclass(frozen=True)
class JobFacts:
    steps_recorded: int
    first_reward: float | None
    reward_at_step: float | None
    accuracy_before: float | None
    accuracy_after: float | None
    accuracy_after_step: int | None
    held_out_problems: int | None
    # How the held-out evaluation drew (None: the records do not say): temperature 0 is greedy.
    held_out_temperature: float | None = None
    held_out_samples: int | None = None


def _accuracy(result) -> float | None:
    if isinstance(result, dict) and isinstance(result.get("accuracy"), (int, float)):
        return float(result["accuracy"])
    return None


def _problems(result) -> int | None:
    return int(result["problems"]) if isinstance(result, dict) and isinstance(result.get("problems"), int) else None


def _sampling(result) -> tuple[float | None, int | None]:
    if not isinstance(result, dict) or not isinstance(result.get("temperature", 0.0), (int, float)):
        return None, None
    samples = result.get("samples", 1)
    return float(result.get("temperature", 0.0)), samples if isinstance(samples, int) else None


def job_facts(job_dir: Path, step: int) -> JobFacts:
    """The facts about `job_dir` as of `step` (the exported checkpoint's step)."""
    records = [r for r in read_jsonl(Path(job_dir) / "metrics.jsonl") if isinstance(r.get("step"), int)]
    by_step = {r["step"]: r for r in records}
    first = by_step.get(min(by_step)) if by_step else None
    at_step = by_step.get(step)
    before = after = after_step = problems = None
    sampling: tuple[float | None, int | None] = (None, None)
    # Periodic evaluations in the step records: the one at or before the exported step.
    evaluated = [r for r in records if _accuracy(r.get("eval")) is not None and r["step"] <= step]
    if evaluated:
        latest = max(evaluated, key=lambda r: r["step"])
        after, after_step, problems = _accuracy(latest["eval"]), latest["step"], _problems(latest["eval"])
        sampling = _sampling(latest["eval"])
    summary_path = Path(job_dir) / "eval.json"
    if summary_path.is_file():
        try:
            summary = json.loads(summary_path.read_text())
        except json.JSONDecodeError:
            summary = {}
        before = _accuracy(summary.get("before"))
        final_step = max(by_step) if by_step else None
        if after is None and _accuracy(summary.get("after")) is not None and final_step == step:
            after, after_step = _accuracy(summary["after"]), step
        problems = problems or _problems(summary.get("after")) or _problems(summary.get("before"))
        if sampling == (None, None):
            sampling = _sampling(summary.get("after") or summary.get("before"))
    return JobFacts(
        steps_recorded=len(by_step),
        first_reward=float(first["reward_mean"]) if first and "reward_mean" in first else None,
        reward_at_step=float(at_step["reward_mean"]) if at_step and "reward_mean" in at_step else None,
        accuracy_before=before,
        accuracy_after=after,
        accuracy_after_step=after_step,
        held_out_problems=problems,
        held_out_temperature=sampling[0],
        held_out_samples=sampling[1],
    )
