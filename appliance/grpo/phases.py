"""Enter, time and announce the phases of one step, and record their memory peaks: one context manager.

clock = PhaseClock(ledger, announce, enter)
with clock.phase("generate"):
    ...
clock.seconds  ->  {"generate": 8.1, ...}
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Callable, Iterator

# Each timed phase of a step -> the budget plan's phase it runs in, or None where the plan has none.
# The plan names the scoring phase after the judge, the engine it adds there (and plans it only for
# a judge); the step, its events and StepRecord.seconds call it "reward".
PLANNED: dict[str, str | None] = {
    "generate": "generate",
    "reward": "judge",
    "train": "train",
    "sync": None,
    "checkpoint": None,
    "eval": None,
}


class PhaseClock:
    """`enter(planned)` puts the engines in the state the plan assumed for a planned phase (time sharing)."""

    def __init__(
        self,
        ledger=None,
        announce: Callable[..., None] | None = None,
        enter: Callable[[str], None] | None = None,
    ):
        self.ledger = ledger
        self.announce = announce or (lambda kind, **data: None)
        self.enter = enter or (lambda planned: None)
        self.seconds: dict[str, float] = {}
        self.started = time.monotonic()

    def _measures(self, planned: str | None) -> bool:
        # On CUDA the allocator reports peaks; on the CPU freed memory stays in the process,
        # so only the whole run's peak RSS is comparable with the plan.
        return (
            planned is not None
            and self.ledger is not None
            and self.ledger.plan.device.kind == "cuda"
            and planned in self.ledger.plan.phases
        )

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if name not in PLANNED:
            raise ValueError(f"phase {name!r} is not one of {tuple(PLANNED)}")
        planned = PLANNED[name]
        self.announce("phase", phase=name, state="start")
        if planned is not None:
            self.enter(planned)  # outside the timed part: waking and sleeping engines is not the phase's work
        measures = self._measures(planned)
        if measures:
            from appliance.budget.device_probe import reset_peak

            reset_peak(self.ledger.plan.device.kind)
        began = time.monotonic()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.monotonic() - began
            if measures:
                from appliance.budget.device_probe import peak_bytes

                self.ledger.phase_peak(planned, peak_bytes(self.ledger.plan.device.kind))
            self.announce("phase", phase=name, state="end")

    def total(self) -> dict[str, float]:
        """The phase seconds plus "step", the whole step so far."""
        return {**self.seconds, "step": time.monotonic() - self.started}
