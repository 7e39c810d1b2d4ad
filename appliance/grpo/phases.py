"""Time the phases of one step, record their memory peaks and announce them: one context manager.

    clock = PhaseClock(ledger, announce)
    with clock.phase("generate", memory="generate"):
        ...
    clock.seconds  ->  {"generate": 8.1, ...}

`memory` names the budget plan's phase whose peak this phase measures (on
CUDA, where the allocator reports peaks; on the CPU freed memory stays in the
process, so only the whole run's peak RSS is comparable with the plan).
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Callable, Iterator


class PhaseClock:
    def __init__(self, ledger=None, announce: Callable[..., None] | None = None):
        self.ledger = ledger
        self.announce = announce or (lambda kind, **data: None)
        self.seconds: dict[str, float] = {}
        self.started = time.monotonic()

    def _measures(self, memory: str | None) -> bool:
        return (
            memory is not None
            and self.ledger is not None
            and self.ledger.plan.device.kind == "cuda"
            and memory in self.ledger.plan.phases
        )

    @contextmanager
    def phase(self, name: str, memory: str | None = None) -> Iterator[None]:
        measures = self._measures(memory)
        if measures:
            from appliance.budget.device import reset_peak

            reset_peak(self.ledger.plan.device.kind)
        self.announce("phase", phase=name, state="start")
        began = time.monotonic()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.monotonic() - began
            if measures:
                from appliance.budget.device import peak_bytes

                self.ledger.phase_peak(memory, peak_bytes(self.ledger.plan.device.kind))
            self.announce("phase", phase=name, state="end")

    def total(self) -> dict[str, float]:
        """The phase seconds plus "step", the whole step so far."""
        return {**self.seconds, "step": time.monotonic() - self.started}
