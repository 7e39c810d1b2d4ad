"""The trainer's view of the job's judge: its engine, step, token and time totals, outcomes and log.

The Trainer picks one at construction: `JudgeSeat` around the job's Judge, or `NoJudge`
when the job has none, whose answers are what a step without a judge records.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from appliance.engines.engine import GenerationEngine
from appliance.judge.log import JudgeLog

if TYPE_CHECKING:
    from appliance.judge.judge import Judge


class Judging(Protocol):
    engine: GenerationEngine | None  # handed to the time-share after the student's engine

    def set_step(self, step: int) -> None: ...

    def engines(self) -> list[GenerationEngine]: ...

    def totals(self) -> dict: ...

    def split_seconds(self, seconds: dict[str, float], before: dict) -> dict[str, float]: ...

    def outcomes(self) -> dict[str, int]: ...

    def log_to(self, path: Path) -> None: ...

    def close(self) -> None: ...


def judging_for(judge: Judge | None) -> Judging:
    return NoJudge() if judge is None else JudgeSeat(judge)


class NoJudge:
    """A job without a judge: no engine, no totals, no judge phase, no outcomes."""

    engine = None

    def set_step(self, step: int) -> None:
        pass

    def engines(self) -> list[GenerationEngine]:
        return []

    def totals(self) -> dict:
        return {}

    def split_seconds(self, seconds: dict[str, float], before: dict) -> dict[str, float]:
        return seconds

    def outcomes(self) -> dict[str, int]:
        return {}

    def log_to(self, path: Path) -> None:
        pass

    def close(self) -> None:
        pass


class JudgeSeat:
    """The job's Judge as the trainer sees it."""

    def __init__(self, judge: Judge):
        self.judge = judge

    @property
    def engine(self) -> GenerationEngine:
        return self.judge.engine

    def set_step(self, step: int) -> None:
        self.judge.set_step(step)

    def engines(self) -> list[GenerationEngine]:
        return [self.engine]

    def totals(self) -> dict:
        """The judge's own token and second totals so far (its engine's counters may be the student's)."""
        stats = self.judge.stats()
        return {"judge": (stats["generated_tokens"], stats["prompt_tokens"]), "judge_seconds": stats["seconds"]}

    def split_seconds(self, seconds: dict[str, float], before: dict) -> dict[str, float]:
        """The judge's share of the reward phase shown as its own phase (`before` is totals() at step start)."""
        judged = self.judge.stats()["seconds"] - before["judge_seconds"]
        seconds["judge"] = judged
        seconds["reward"] = max(0.0, seconds.get("reward", 0.0) - judged)
        return seconds

    def outcomes(self) -> dict[str, int]:
        return dict(self.judge.outcomes)

    def log_to(self, path: Path) -> None:
        """Write the judge's log lines to `path` from now on (a data-parallel rank other than 0)."""
        if self.judge.log is not None:
            self.judge.log.close()
            self.judge.log = JudgeLog(path, self.judge.spec.log_max_bytes, self.judge.spec.log_backups)

    def close(self) -> None:
        self.judge.close()
