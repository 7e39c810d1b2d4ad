"""The appliance's Prometheus metrics (DESIGN.md "Prometheus metric names"), updated from plain data.

`TrainingMetrics` owns one CollectorRegistry holding exactly the `appliance_*`
metrics of the design table plus the re-exported `vllm:*` engine metrics. Its
`observe_*` methods take what the rest of the appliance already produces: the
trainer's metrics.jsonl record, the memory Plan and Ledger, a DeviceInfo, the
judge's outcome and token totals, an engine snapshot. Labels never carry job
ids or steps, so the series count stays fixed however long the appliance runs.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from appliance.metrics.engines import EngineSnapshotCollector

if TYPE_CHECKING:
    from appliance.budget.device import DeviceInfo
    from appliance.budget.ledger import Ledger
    from appliance.budget.plan import Plan

PREFIX = "appliance_"
# The phases of a step that the trainer's record times (its "step" total is the sum, not a phase).
STEP_PHASES = ("generate", "judge", "reward", "train", "sync", "checkpoint")
# From a fraction of a second (CPU sync) to half an hour (a large GPU step with a judge).
STEP_DURATION_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, float("inf"))
STUDENT, JUDGE = "student", "judge"


class MetricsRecordError(ValueError):
    """A trainer metrics record lacks a key the metrics need."""


class TrainingMetrics:
    """The appliance_* metrics in one registry; call the observe_* methods as the data arrives."""

    def __init__(self, registry: CollectorRegistry | None = None, *, version: str, student_model: str,
                 judge_model: str | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.generated_tokens = Counter(PREFIX + "generated_tokens", "Tokens generated", ["role"], registry=r)
        self.prompt_tokens = Counter(PREFIX + "prompt_tokens", "Prompt tokens read by generation", ["role"],
                                     registry=r)
        self.completions = Counter(PREFIX + "completions", "Student completions generated for training", registry=r)
        self.train_steps = Counter(PREFIX + "train_steps", "GRPO steps completed", registry=r)
        self.step_duration = Histogram(PREFIX + "step_duration_seconds", "Seconds per phase of a training step",
                                       ["phase"], buckets=STEP_DURATION_BUCKETS, registry=r)
        self.tokens_per_second = Gauge(PREFIX + "generation_tokens_per_second",
                                       "Generated tokens per second of generation, last step", ["role"], registry=r)
        self.reward_mean = Gauge(PREFIX + "reward_mean", "Mean total reward of the last step", registry=r)
        self.reward_std = Gauge(PREFIX + "reward_std", "Standard deviation of the total reward, last step", registry=r)
        self.kl = Gauge(PREFIX + "kl", "KL divergence to the reference policy, last step", registry=r)
        self.loss = Gauge(PREFIX + "loss", "GRPO loss of the last step", registry=r)
        self.clip_ratio = Gauge(PREFIX + "clip_ratio", "Fraction of clipped token ratios, last step", registry=r)
        self.memory_planned = Gauge(PREFIX + "memory_planned_bytes", "Planned device bytes per component",
                                    ["component"], registry=r)
        self.memory_used = Gauge(PREFIX + "memory_used_bytes", "Largest measured device bytes per component",
                                 ["component"], registry=r)
        self.memory_budget = Gauge(PREFIX + "memory_budget_bytes", "Device memory budget of the job", registry=r)
        self.device_total = Gauge(PREFIX + "device_memory_total_bytes", "Device memory in total", registry=r)
        self.device_used = Gauge(PREFIX + "device_memory_used_bytes", "Device memory in use", registry=r)
        self.judge_requests = Counter(PREFIX + "judge_requests", "Judge requests by outcome", ["outcome"], registry=r)
        self.jobs = Gauge(PREFIX + "jobs", "Jobs by state", ["state"], registry=r)
        self.disk_free = Gauge(PREFIX + "disk_free_bytes", "Free bytes on the data dir's file system", registry=r)
        self.build_info = Gauge(PREFIX + "build_info", "Always 1; the labels say what runs",
                                ["version", "student_model", "judge_model"], registry=r)
        self.build_info.labels(version=version, student_model=student_model, judge_model=judge_model or "").set(1)

        self.engines = EngineSnapshotCollector()
        r.register(self.engines)
        # Judge totals are cumulative; counters advance by the difference to the last totals seen.
        self._judge_seen: dict[str, float] = {}
        self._job_states: set[str] = set()

    # ----- the trainer's metrics.jsonl record ---------------------------------------------------

    def observe_step(self, record: Mapping, completions: int | None = None) -> None:
        """One finished step, as the trainer writes it to metrics.jsonl.

        `completions` (or the record's "completions" key) counts the student's
        completions of the step, and the record's "prompt_tokens" the prompt
        tokens; when absent, those counters are left as they are. The judge
        phase of step_duration_seconds comes from `observe_judge`, not from here.
        """
        step = record.get("step", "?")

        def need(key: str, within: Mapping = record, where: str = ""):
            if key not in within:
                raise MetricsRecordError(f"metrics record of step {step} has no '{where}{key}'; "
                                         "pass the dict the trainer writes to metrics.jsonl")
            return within[key]

        self.generated_tokens.labels(role=STUDENT).inc(need("generated_tokens"))
        self.tokens_per_second.labels(role=STUDENT).set(need("tokens_per_second"))
        if record.get("prompt_tokens") is not None:
            self.prompt_tokens.labels(role=STUDENT).inc(record["prompt_tokens"])
        completions = record.get("completions") if completions is None else completions
        if completions is not None:
            self.completions.inc(completions)
        self.reward_mean.set(need("reward_mean"))
        self.reward_std.set(need("reward_std"))
        self.kl.set(need("kl"))
        self.loss.set(need("loss"))
        self.clip_ratio.set(need("clip_ratio"))
        seconds = need("seconds")
        for phase in STEP_PHASES:
            if phase != JUDGE and seconds.get(phase) is not None:
                self.step_duration.labels(phase=phase).observe(seconds[phase])
        self.train_steps.inc()

    # ----- memory ------------------------------------------------------------------------------

    def observe_plan(self, plan: "Plan") -> None:
        """The memory plan: planned bytes per component and the budget."""
        for component, size in plan.components.items():
            self.memory_planned.labels(component=component).set(size)
        self.memory_budget.set(plan.budget_bytes)

    def observe_ledger(self, ledger: "Ledger") -> None:
        """What the components really used so far (the largest measurement of each)."""
        for component, gauges in ledger.gauges().items():
            self.memory_planned.labels(component=component).set(gauges["planned_bytes"])
            self.memory_used.labels(component=component).set(gauges["used_bytes"])

    def observe_device(self, device: "DeviceInfo") -> None:
        self.device_total.set(device.total_bytes)
        self.device_used.set(device.used_bytes)

    def observe_disk(self, path: str | Path) -> None:
        """Free bytes where `path` lives (the data dir: checkpoints and the model store)."""
        self.disk_free.set(shutil.disk_usage(path).free)

    # ----- judge, jobs, engines ----------------------------------------------------------------

    def observe_judge(self, stats: Mapping, outcomes: Mapping[str, int] | None = None) -> None:
        """The judge's running totals: `Judge.stats()` and `Judge.outcomes`; call after each step.

        The counters advance by what grew since the last call. Totals that went
        down belong to a new Judge (a new job), so they count from zero again.
        The judge's generate seconds since the last call are one judge-phase
        observation of step_duration_seconds.
        """
        outcomes = stats.get("outcomes", {}) if outcomes is None else outcomes
        for outcome, total in outcomes.items():
            self.judge_requests.labels(outcome=outcome).inc(self._grown(f"outcome:{outcome}", total))
        self.generated_tokens.labels(role=JUDGE).inc(self._grown("generated_tokens", stats.get("generated_tokens", 0)))
        self.prompt_tokens.labels(role=JUDGE).inc(self._grown("prompt_tokens", stats.get("prompt_tokens", 0)))
        if "tokens_per_second" in stats:
            self.tokens_per_second.labels(role=JUDGE).set(stats["tokens_per_second"])
        if "seconds" in stats:
            judged = self._grown("seconds", stats["seconds"])
            if judged > 0:
                self.step_duration.labels(phase=JUDGE).observe(judged)

    def _grown(self, key: str, total: float) -> float:
        last = self._judge_seen.get(key, 0)
        self._judge_seen[key] = total
        return total - last if total >= last else total

    def set_jobs(self, counts: Mapping[str, int]) -> None:
        """The daemon's job count per state; states not given are set to 0."""
        self._job_states |= set(counts)
        for state in self._job_states:
            self.jobs.labels(state=state).set(counts.get(state, 0))

    def add_engine_snapshot(self, snapshot: dict) -> None:
        """A vLLM engine's `metrics_snapshot()`; replaces the earlier one of the same model_name."""
        self.engines.add(snapshot)
