"""`RunHooks`: where a trainer reports, handed to it at construction.

`on_step` gets every finished step's StepRecord; `on_event` gets RunEvents:
phase changes, checkpoints, evaluations, engine metrics, memory readings and
every line written to the job's log.txt.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from appliance.grpo.step_record import RunEvent, StepRecord

StepCallback = Callable[[StepRecord], None]
EventCallback = Callable[[RunEvent], None]
StopCallback = Callable[[], "str | None"]


def _ignore(_: object) -> None:
    pass


@dataclass(frozen=True)
class RunHooks:
    on_step: StepCallback = _ignore
    on_event: EventCallback = _ignore
