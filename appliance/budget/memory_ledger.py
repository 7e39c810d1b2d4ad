"""The runtime ledger: what each component and phase really used, next to the plan.

The trainer records a measurement when it loads a component and the peak of
each phase; the ledger keeps the largest of each, warns when one exceeds its
plan by more than 10%, and exports both for the Prometheus gauges
appliance_memory_planned_bytes / appliance_memory_used_bytes{component}.
The trainer's out-of-memory retry (grpo/update.py) records each halving here.

In the step loop:

    reset_peak(device.kind); run the phase; ledger.phase_peak("generate", peak_bytes(device.kind))

(`reset_peak` and `peak_bytes` are in appliance.budget.device_probe.)
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from appliance.budget.plan import Plan
from appliance.config.sizes import format_bytes

if TYPE_CHECKING:
    import torch

# Warn only past this share over the plan: whole-job peaks vary from run to run by a few percent
# (bench/README.md, "memory_plan.py"), and a warning every step would drown the ones that matter.
OVER_PLAN_TOLERANCE = 0.10
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Halving:
    """One out-of-memory retry: the micro-batch went from `from_size` to `to_size`."""

    from_size: int
    to_size: int
    error: str
    time: float


@dataclass
class Ledger:
    plan: Plan
    used: dict[str, int] = field(default_factory=dict)  # component -> largest measured bytes
    phase_peaks: dict[str, int] = field(default_factory=dict)  # phase -> largest measured peak
    warnings: list[str] = field(default_factory=list)
    halvings: list[Halving] = field(default_factory=list)

    def measure(self, component: str, size_bytes: int) -> None:
        """Record what a component holds now (e.g. right after loading it)."""
        if component not in self.plan.components:
            raise KeyError(f"'{component}' is not a planned component ({', '.join(self.plan.components)})")
        self.used[component] = max(self.used.get(component, 0), int(size_bytes))
        self._check(f"component {component}", int(size_bytes), self.plan.components[component])

    def measure_loaded(self, student: torch.nn.Module, rollout: torch.nn.Module | None) -> None:
        """What the loaded models hold: the student's frozen base, its adapter (with gradients) and a separate
        rollout copy of its weights (a merged copy shares the student's embeddings, so they count once)."""
        lora = [p for p in student.parameters() if p.requires_grad]
        frozen = [p for p in student.parameters() if not p.requires_grad]
        self.measure("student_weights", _tensor_bytes(frozen) + _tensor_bytes(student.buffers()))
        self.measure("student_lora", 2 * _tensor_bytes(lora))  # parameters + gradients
        if rollout is not None and rollout is not student and "rollout_weights" in self.plan.components:
            shared = {p.data_ptr() for p in student.parameters()}
            self.measure(
                "rollout_weights", _tensor_bytes(p for p in rollout.parameters() if p.data_ptr() not in shared)
            )

    def phase_peak(self, phase: str, size_bytes: int) -> None:
        """Record the peak device memory seen during one phase of a step."""
        if phase not in self.plan.phases:
            raise KeyError(f"'{phase}' is not a planned phase ({', '.join(self.plan.phases)})")
        self.phase_peaks[phase] = max(self.phase_peaks.get(phase, 0), int(size_bytes))
        self._check(f"phase {phase}", int(size_bytes), self.plan.phases[phase].peak_bytes)

    def _check(self, what: str, measured: int, planned: int) -> None:
        if measured > planned * (1 + OVER_PLAN_TOLERANCE):
            message = (
                f"{what} uses {format_bytes(measured)}, {measured / planned - 1:.0%} over its plan of "
                f"{format_bytes(planned)}"
                if planned
                else f"{what} uses {format_bytes(measured)} but was planned at 0 B"
            )
            if message not in self.warnings:  # once per distinct excess, not once per step
                self.warnings.append(message)
                log.warning("memory: %s", message)

    def record_halving(self, from_size: int, to_size: int, error: BaseException) -> None:
        self.halvings.append(
            # The first line of torch's message says what failed to allocate; the rest is allocator advice.
            Halving(from_size, to_size, str(error).splitlines()[0] if str(error) else type(error).__name__, time.time())
        )
        log.warning("out of memory at micro-batch %d; retrying the step with %d", from_size, to_size)

    def gauges(self) -> dict[str, dict[str, int]]:
        """Per component: planned and used bytes, for appliance_memory_{planned,used}_bytes{component}."""
        return {
            name: {"planned_bytes": planned, "used_bytes": self.used.get(name, 0)}
            for name, planned in self.plan.components.items()
        }

    def to_dict(self) -> dict:
        return {
            "budget_bytes": self.plan.budget_bytes,
            "components": self.gauges(),
            "phases": {
                name: {"planned_bytes": phase.peak_bytes, "peak_bytes": self.phase_peaks.get(name, 0)}
                for name, phase in self.plan.phases.items()
            },
            "warnings": list(self.warnings),
            "oom_halvings": [
                {"from": h.from_size, "to": h.to_size, "error": h.error, "time": h.time} for h in self.halvings
            ],
        }


def _tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)
