"""The appliance's Prometheus metrics (DESIGN.md "Prometheus metric names"), updated from plain data.

`TrainingMetrics` owns one CollectorRegistry holding exactly the `appliance_*`
metrics of the design table plus the re-exported `vllm:*` engine metrics. Its
`observe_*` methods take what the rest of the appliance already produces: a
StepRecord, the memory Plan and Ledger, a DeviceInfo, the
judge's outcome and token totals, an engine snapshot. Labels never carry job
ids or steps, so the series count stays fixed however long the appliance runs.
The gauges of a running job carry a bounded `device` label (the slot index,
"0" for a foreground run), appear with their first value and are removed by
`forget_slot` when the job's worker ends.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from appliance.grpo.step_record import PHASES, StepRecord
from appliance.metrics.engines import EngineSnapshotCollector

if TYPE_CHECKING:
    from appliance.budget.device_probe import DeviceInfo
    from appliance.budget.memory_ledger import Ledger
    from appliance.budget.plan import Plan

PREFIX = "appliance_"
# The phases of a step that a StepRecord times (its "step" total is the whole step, not a phase).
STEP_PHASES = PHASES
# From a fraction of a second (CPU sync) to half an hour (a large GPU step with a judge).
STEP_DURATION_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, float("inf"))
STUDENT, JUDGE = "student", "judge"
SLOT = ["device"]  # DESIGN.md: per-job series carry a bounded `device` label (the slot)


class TrainingMetrics:
    """The appliance_* metrics in one registry; call the observe_* methods as the data arrives."""

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        version: str,
        student_model: str,
        judge_model: str | None = None,
    ) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self._define_training(r)
        self._define_memory_and_service(r)
        self.build_info.labels(version=version, student_model=student_model, judge_model=judge_model or "").set(1)

        self.engines = EngineSnapshotCollector()
        r.register(self.engines)
        # Judge outcome totals are cumulative; counters advance by the difference to the last totals seen.
        self._judge_seen: dict[tuple[str, str], float] = {}  # (slot, outcome) -> the running job's last total
        self._series: dict[str, set[tuple[Gauge, tuple[str, ...]]]] = {}  # slot -> the gauges set for it
        self._job_states: set[str] = set()

    def _define_training(self, r: CollectorRegistry) -> None:
        """Tokens, steps, phase durations and the step's learning signals."""
        self.generated_tokens = Counter(PREFIX + "generated_tokens", "Tokens generated", ["role"], registry=r)
        self.prompt_tokens = Counter(PREFIX + "prompt_tokens", "Prompt tokens read by generation", ["role"], registry=r)
        self.completions = Counter(PREFIX + "completions", "Student completions generated for training", registry=r)
        self.train_steps = Counter(PREFIX + "train_steps", "GRPO steps completed", registry=r)
        self.step_duration = Histogram(
            PREFIX + "step_duration_seconds",
            "Seconds per phase of a training step",
            ["phase"],
            buckets=STEP_DURATION_BUCKETS,
            registry=r,
        )
        self.tokens_per_second = Gauge(
            PREFIX + "generation_tokens_per_second",
            "Generated tokens per second of generation, last step",
            ["role", "device"],
            registry=r,
        )
        self.reward_mean = Gauge(PREFIX + "reward_mean", "Mean total reward of the last step", SLOT, registry=r)
        self.reward_std = Gauge(
            PREFIX + "reward_std", "Standard deviation of the total reward, last step", SLOT, registry=r
        )
        self.kl = Gauge(PREFIX + "kl", "KL divergence to the reference policy, last step", SLOT, registry=r)
        self.loss = Gauge(PREFIX + "loss", "GRPO loss of the last step", SLOT, registry=r)
        self.clip_ratio = Gauge(PREFIX + "clip_ratio", "Fraction of clipped token ratios, last step", SLOT, registry=r)
        self.last_step_time = Gauge(
            PREFIX + "last_step_timestamp_seconds", "When the running job last finished a step", SLOT, registry=r
        )

    def _define_memory_and_service(self, r: CollectorRegistry) -> None:
        """Memory planned and used, the device, the judge, the job queue, the disk and the build."""
        self.memory_planned = Gauge(
            PREFIX + "memory_planned_bytes", "Planned device bytes per component", ["component", "device"], registry=r
        )
        self.memory_used = Gauge(
            PREFIX + "memory_used_bytes",
            "Largest measured device bytes per component",
            ["component", "device"],
            registry=r,
        )
        self.memory_budget = Gauge(PREFIX + "memory_budget_bytes", "Device memory budget of the job", SLOT, registry=r)
        self.device_total = Gauge(PREFIX + "device_memory_total_bytes", "Device memory in total", SLOT, registry=r)
        self.device_used = Gauge(PREFIX + "device_memory_used_bytes", "Device memory in use", SLOT, registry=r)
        self.judge_requests = Counter(PREFIX + "judge_requests", "Judge requests by outcome", ["outcome"], registry=r)
        self.jobs = Gauge(PREFIX + "jobs", "Jobs by state", ["state"], registry=r)
        self.disk_free = Gauge(PREFIX + "disk_free_bytes", "Free bytes on the data dir's file system", registry=r)
        self.eval_accuracy = Gauge(
            PREFIX + "eval_accuracy", "Held-out accuracy at the last evaluation", SLOT, registry=r
        )
        self.nonfinite_steps = Counter(
            PREFIX + "nonfinite_steps",
            "Steps whose optimizer step was skipped for a NaN/inf loss or gradient",
            registry=r,
        )
        self.build_info = Gauge(
            PREFIX + "build_info",
            "Always 1; the labels say what runs",
            ["version", "student_model", "judge_model"],
            registry=r,
        )

    # ----- one finished step ------------------------------------------------------------------

    def _gauge(self, gauge: Gauge, slot: str, *values: str):
        """The child of a per-job gauge on `slot`, remembered so that forget_slot removes it."""
        labels = (*values, slot)
        self._series.setdefault(slot, set()).add((gauge, labels))
        return gauge.labels(*labels)

    def forget_slot(self, slot: str) -> None:
        """The job on `slot` ended: its gauges disappear (no alert on a finished job) and judge totals restart."""
        for gauge, labels in self._series.pop(slot, set()):
            try:
                gauge.remove(*labels)
            except KeyError:
                pass
        self._judge_seen = {key: total for key, total in self._judge_seen.items() if key[0] != slot}

    def observe_step(self, record: StepRecord, slot: str = "0") -> None:
        """One finished step: counters advance by the step's amounts, gauges show this step.

        The judge's outcome counts in the record are cumulative for the job;
        the counters advance by what grew since the last record seen.
        """
        for role, tokens in record.generated_tokens.items():
            self.generated_tokens.labels(role=role).inc(tokens)
        for role, tokens in record.prompt_tokens.items():
            self.prompt_tokens.labels(role=role).inc(tokens)
        for role, rate in record.tokens_per_second.items():
            self._gauge(self.tokens_per_second, slot, role).set(rate)
        self.completions.inc(record.completions)
        self._gauge(self.reward_mean, slot).set(record.reward_mean)
        self._gauge(self.reward_std, slot).set(record.reward_std)
        self._gauge(self.kl, slot).set(record.kl)
        self._gauge(self.loss, slot).set(record.loss)
        self._gauge(self.clip_ratio, slot).set(record.clip_ratio)
        self._gauge(self.last_step_time, slot).set(record.time)
        for phase in STEP_PHASES:
            if record.seconds.get(phase) is not None:
                self.step_duration.labels(phase=phase).observe(record.seconds[phase])
        for outcome, total in record.judge_outcomes.items():
            self.judge_requests.labels(outcome=outcome).inc(self._grown((slot, outcome), total))
        if record.nonfinite:
            self.nonfinite_steps.inc()
        if record.eval is not None:
            self._gauge(self.eval_accuracy, slot).set(record.eval.accuracy)
        for component, used in record.memory.components_used_bytes.items():
            self._gauge(self.memory_used, slot, component).set(used)
        if record.memory.device_used_bytes is not None:
            self._gauge(self.device_used, slot).set(record.memory.device_used_bytes)
        self.train_steps.inc()

    # ----- memory ------------------------------------------------------------------------------

    def observe_plan(self, plan: "Plan", slot: str = "0") -> None:
        """The memory plan: planned bytes per component and the budget."""
        self.observe_planned(plan.components, plan.budget_bytes, slot)

    def observe_planned(self, components: Mapping[str, int], budget_bytes: int, slot: str = "0") -> None:
        """Planned bytes per component and the budget, as plain data (a run's "memory" event)."""
        for component, size in components.items():
            self._gauge(self.memory_planned, slot, component).set(size)
        self._gauge(self.memory_budget, slot).set(budget_bytes)

    def observe_ledger(self, ledger: "Ledger", slot: str = "0") -> None:
        """What the components really used so far (the largest measurement of each)."""
        for component, gauges in ledger.gauges().items():
            self._gauge(self.memory_planned, slot, component).set(gauges["planned_bytes"])
            self._gauge(self.memory_used, slot, component).set(gauges["used_bytes"])

    def observe_device(self, device: "DeviceInfo", slot: str = "0") -> None:
        self.observe_device_bytes(device.total_bytes, device.used_bytes, slot)

    def observe_device_bytes(self, total_bytes: int, used_bytes: int | None, slot: str = "0") -> None:
        self._gauge(self.device_total, slot).set(total_bytes)
        if used_bytes is not None:
            self._gauge(self.device_used, slot).set(used_bytes)

    def observe_disk(self, path: str | Path) -> None:
        """Free bytes where `path` lives (the data dir: checkpoints and the model store)."""
        self.disk_free.set(shutil.disk_usage(path).free)

    # ----- judge, jobs, engines ----------------------------------------------------------------

    def _grown(self, key: tuple[str, str], total: float) -> float:
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
